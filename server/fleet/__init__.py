"""pagode past one machine: Ray Serve deployments of the OpenAI server (ray_app.py), the
request router that sends a prompt where its prefix blocks are cached (prefix_router.py), and
the pieces they share (relay.py, block_keys.py). Needs the `ray` extra."""

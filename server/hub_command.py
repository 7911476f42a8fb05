"""Hub names on the command line: `pagode pull NAME` fetches a model into the hub cache, and
`pagode serve NAME` fetches it (or finds it cached) before the server starts, so a name that
cannot be had stops the command with one sentence and no server half up.

The download runs before the port is bound, as vLLM's does: a failure is the command's exit
status, not a /health that never turns ready.
"""

from __future__ import annotations

import argparse
import sys

from engine.model.hub import HubError, fetch, is_hub_name

NAME_HELP = ("a Hugging Face hub name: ORG/REPO (a safetensors folder) or ORG/REPO:QUANT (that GGUF of "
             "the repo, as llama-server -hf picks it); HF_ENDPOINT, HF_TOKEN, HF_HOME and "
             "HF_HUB_OFFLINE apply")


def add_revision_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--revision", default=None,
                        help="the hub revision (branch, tag or commit) of a hub model (default: main)")


def add_pull_command(commands: argparse._SubParsersAction) -> None:
    pull = commands.add_parser("pull", help="download a model from the Hugging Face hub without serving it",
                               description="Download a model into the hub cache (resumed if an earlier "
                                           "download stopped) and print its local path.")
    pull.add_argument("name", help=NAME_HELP)
    add_revision_flag(pull)


def run_pull(args: argparse.Namespace) -> int:
    try:
        path = fetch(args.name, args.revision)
    except HubError as err:
        print(f"pagode pull: error: {err}", file=sys.stderr)
        return 1
    print(path)
    return 0


def fetch_served_model(args: argparse.Namespace) -> None:
    """Put the local path of a hub `--model` in its place, and serve it under the name typed
    unless --served-model-name says otherwise. Raises HubError."""
    if not is_hub_name(args.model):
        return
    name = args.model
    args.model = str(fetch(name, args.revision))
    if args.served_model_name is None:
        args.served_model_name = name

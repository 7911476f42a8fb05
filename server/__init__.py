"""pagode's OpenAI-compatible HTTP server: FastAPI + uvicorn in front of the AsyncEngine."""

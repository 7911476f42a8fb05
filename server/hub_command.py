"""Hub names on the command line: `pagode pull NAME` fetches a model into the hub cache;
`pagode serve NAME` fetches it (or finds it cached) the same way before the server starts
(server/serve_models.py), so a name that cannot be had stops the command with one sentence
and no server half up: a failure is the command's exit status, as vLLM's is, not a /health
that never turns ready.
"""

from __future__ import annotations

import argparse
import sys

from engine.model.hub import HubError, fetch

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

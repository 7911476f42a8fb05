"""llama.cpp's `convert_hf_to_gguf.py`, imported once and run for each job a test session
sends (tests/converter_files.py): a fresh converter process spends most of a tiny model's
conversion importing torch, transformers and the converter's model classes, and a session
converts a few dozen folders.

    python tests/converter_worker.py PATH/convert_hf_to_gguf.py LOG

Each line on stdin is one JSON list, the converter's arguments; its `main()` runs on them as
the script would, and one JSON line comes back on stdout: {"rc": exit status, "output": the
tail of what the job wrote}. The converter's own output (logging, progress) goes to LOG.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from pathlib import Path


def main() -> None:
    script, log = Path(sys.argv[1]), sys.argv[2]
    replies = os.fdopen(os.dup(1), "w")
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(out, 1)
    os.dup2(out, 2)
    sys.path[0] = str(script.parent)  # the converter's `conversion` package, as for the script
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", script)
    assert spec is not None and spec.loader is not None
    converter = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = converter
    spec.loader.exec_module(converter)
    for line in sys.stdin:
        start = os.lseek(out, 0, os.SEEK_END)
        sys.argv = [str(script), *json.loads(line)]
        rc = 0
        try:
            converter.main()
        except SystemExit as stop:
            rc = stop.code if isinstance(stop.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported to the test as the job's failure
            traceback.print_exc()
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        with open(log, "rb") as written:
            written.seek(max(start, os.lseek(out, 0, os.SEEK_END) - 6000))
            tail = written.read().decode(errors="replace")
        replies.write(json.dumps({"rc": rc, "output": tail}) + "\n")
        replies.flush()


if __name__ == "__main__":
    main()

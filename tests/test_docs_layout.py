"""docs/architecture.md's layout list names the code as it is: every entry exists, and every
folder of the packages, every module of the engine and every top-level module of the other
packages has an entry that says what it holds.

The list is the first code block under "## The layout": one entry a line, `name  what it
holds`, indented two spaces per folder level below its folder (`name/`); one line may name
several modules (`gemma2.py, gemma3.py`); a line indented to the description column goes on
with the entry above it. A module moved without its entry, or an entry left behind by a
move, fails here, as docs/models.md's table fails test_models_doc.py when a family changes.
The same holds for every repository path the README and the pages name in code font; the
dated records under docs/results/ keep the names of their day.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("engine", "server", "planner", "loadgen", "cpu_kernels", "cuda_kernels")
EVERY_MODULE = ("engine",)  # below these every module is listed; elsewhere folders and top-level modules
CONTINUATION = 20  # a line indented this far or more goes on with the entry above it
NAMED_ROOTS = "|".join((*PACKAGES, "benchmarks", "tests", "scripts"))
NAMED_PATH = re.compile(rf"`((?:{NAMED_ROOTS})/[^`\s]*)`")  # a repository path in code font
FENCE = re.compile(r"```.*?```", flags=re.S)
ENTRY = re.compile(r"(?P<names>[\w.\-]+/?(?:, [\w.\-]+/?)*)(?: {2,}(?P<what>\S.*))?$")


def layout_block() -> list[str]:
    section = DOC.read_text(encoding="utf-8").split("\n## The layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1].splitlines()[1:]


def layout_entries() -> list[tuple[str, str]]:
    """(path, what it holds) for each name of the list, its folders joined by indentation."""
    lines: list[tuple[list[str], str]] = []  # the paths of one line, and what the line says of them
    folders: list[str] = []
    for line in layout_block():
        indent = len(line) - len(line.lstrip(" "))
        if not line.strip():
            continue
        if indent >= CONTINUATION:
            assert lines, f"goes on with no entry: {line!r}"
            lines[-1] = (lines[-1][0], f"{lines[-1][1]} {line.strip()}".strip())
            continue
        match = ENTRY.match(line.strip())
        assert match and indent % 2 == 0, f"not an entry of the layout: {line!r}"
        depth = indent // 2
        assert depth <= len(folders), f"{line.strip()}: indented below no single folder"
        names = match["names"].split(", ")
        lines.append((["/".join([*folders[:depth], name]).rstrip("/") for name in names], match["what"] or ""))
        folders = folders[:depth]
        if len(names) == 1 and names[0].endswith("/"):
            folders.append(names[0].rstrip("/"))
    return [(path, what) for paths, what in lines for path in paths]


def holds_files(folder: Path) -> bool:
    return any(p.is_file() and "__pycache__" not in p.parts for p in folder.rglob("*"))


def code_paths() -> set[str]:
    """What the list must name: the packages' folders, the engine's modules, the others' top ones."""
    paths: set[str] = set()
    for package in PACKAGES:
        top = ROOT / package
        paths.add(package)
        paths |= {str(d.relative_to(ROOT)) for d in top.rglob("*")
                  if d.is_dir() and d.name != "__pycache__" and holds_files(d)}
        modules = top.rglob("*.py") if package in EVERY_MODULE else top.glob("*.py")
        paths |= {str(m.relative_to(ROOT)) for m in modules
                  if m.name != "__init__.py" and "__pycache__" not in m.parts}
    return paths


def test_every_entry_of_the_layout_exists_and_says_what_it_holds() -> None:
    entries = layout_entries()
    assert len(entries) > 50
    paths = [path for path, _ in entries]
    twice = sorted(p for p in set(paths) if paths.count(p) > 1)
    assert not twice, f"listed twice in docs/architecture.md: {twice}"
    gone = [p for p in paths if not (ROOT / p).exists()]
    assert not gone, f"listed in docs/architecture.md, not in the tree: {gone}"
    silent = [p for p, what in entries if not what]
    assert not silent, f"listed in docs/architecture.md with nothing said of it: {silent}"


def test_the_layout_lists_every_folder_and_module_of_the_code() -> None:
    listed = {path for path, _ in layout_entries()}
    missing = sorted(code_paths() - listed)
    assert not missing, f"in the tree, missing from docs/architecture.md's layout: {missing}"


def test_every_path_the_pages_name_exists() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    named = [(page.name, path) for page in pages
             for path in NAMED_PATH.findall(FENCE.sub("", page.read_text(encoding="utf-8")))]
    assert len(named) > 50
    gone = [f"{page}: {path}" for page, path in named
            if not (any(ROOT.glob(path)) if "*" in path else (ROOT / re.split(r"[#:]", path)[0]).exists())]
    assert not gone, f"named in code font, not in the tree: {gone}"

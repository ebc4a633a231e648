"""Every document the code cites is in the repository, and every section it cites is there.

Comments and docstrings point to the project's own docs by section (`docs/protocol.md §3.5`,
`docs/design.md §3.2`); a citation of a file the repository does not hold, or of a section the
file does not have, leaves the reader with nothing.
"""

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# A path to a markdown file, then one or more sections: `docs/protocol.md §2.1, §2.10`.
CITATION = re.compile(r"((?:[\w.-]+/)*[\w.-]+\.md)((?:,? ?(?:§[\d.]*\d)(?:/§?[\d.]*\d)*)+)")
SECTION = re.compile(r"§?([\d.]*\d)")
# Documents that lived beside the checkout and not in it: the repository must not cite them.
OUTSIDE_DOCUMENTS = ("SPEC.md", "DESIGN.md", "YOUZAN-HA.md", "SPARK.md", "INTEROP.md", "STYLE.md")


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py", "*.md", "*.yaml", "*.toml", "Makefile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [REPO / name for name in listed if not name.startswith("tests/reference/")]


def headings(document: Path) -> set[str]:
    """The section numbers of `## 3. ...` and `### 3.5 ...` headings."""
    numbers = set()
    for line in document.read_text().splitlines():
        match = re.match(r"#{2,4} (\d+(?:\.\d+)*)\.? ", line)
        if match:
            numbers.add(match.group(1))
    return numbers


def citations() -> list[tuple[Path, int, str, list[str]]]:
    """(file, line, document, sections) of every citation, also those a line break or a
    comment's `#` cuts in two."""
    found = []
    for path in tracked_text_files():
        text = path.read_text()
        # Each line break, with the indentation and comment marker after it, becomes one space;
        # `starts` maps positions in the joined text back to line numbers.
        joined, starts = "", []
        for line in text.splitlines():
            starts.append(len(joined))
            joined += re.sub(r"^\s*(#\s*)?", "", line) + " "
        for match in CITATION.finditer(joined):
            number = sum(1 for start in starts if start <= match.start())
            found.append((path, number, match.group(1), SECTION.findall(match.group(2))))
    return found


def test_the_code_cites_its_own_docs_by_section():
    cited = {document for _path, _line, document, _sections in citations()}
    assert {"docs/protocol.md", "docs/design.md"} <= cited


def test_every_cited_document_and_section_exists():
    problems = []
    for path, line, document, sections in citations():
        where = f"{path.relative_to(REPO)}:{line}"
        target = REPO / document
        if not target.is_file():
            problems.append(f"{where}: {document} is not in the repository")
            continue
        missing = [s for s in sections if s not in headings(target)]
        if missing:
            problems.append(f"{where}: {document} has no section {', '.join(missing)}")
    assert problems == []


def test_no_file_cites_a_document_from_outside_the_repository():
    offenders = []
    for path in tracked_text_files():
        if path == Path(__file__).resolve():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for document in OUTSIDE_DOCUMENTS:
                if re.search(rf"(?<![\w/.-]){re.escape(document)}", line):
                    offenders.append(f"{path.relative_to(REPO)}:{number}: {document}")
    assert offenders == []


# A source file of this tree named in a document: `nsqd/cluster.py`, `nsqpy/spark/reader.py`.
SOURCE_PATH = re.compile(r"`((?:[\w.-]+/)+[\w.-]+\.(?:py|html|js|css))`")


def test_every_source_file_a_document_names_exists():
    """A document that names a moved or deleted file sends its reader nowhere. bench/RESULTS.md
    records past runs and keeps the names of their day."""
    missing = []
    for path in tracked_text_files():
        if path.suffix != ".md" or path.relative_to(REPO).as_posix() == "bench/RESULTS.md":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for name in SOURCE_PATH.findall(line):
                if not (REPO / name).exists() and not name.startswith(("http", "/")):
                    missing.append(f"{path.relative_to(REPO)}:{number}: {name}")
    assert missing == []

"""README.pypi.md (pyproject's ``readme``, the package index page) is made from README.md: the same text
without the repository's set-up commands and without relative links, which the index cannot follow.

Regenerate after editing README.md: ``python tests/readme_for_index.py`` (tests/test_packaging.py checks
that the committed file is up to date).
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADER = (
    "<!-- The package index page (pyproject's readme), generated from README.md by tests/readme_for_index.py: "
    "README.md without the repository's set-up commands and relative links. -->\n"
)
SDIST_NOTE = (
    "These files ship in the source distribution (`pip download --no-binary :all: --no-deps sglang-moe-plugins`):\n\n"
)
_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://)([^)#\s]+)(#[^)]*)?\)")


def render(readme: str) -> str:
    """The index page for ``readme`` (README.md's text)."""
    text = re.sub(r"```bash\n\./dev\.sh demo[^\n]*\n\./dev\.sh test[^\n]*\n```\n\n", "", readme, count=1)
    text = text.replace(
        "`./dev.sh demo` (or `python -m sglang_moe_plugins.demo`)", "`python -m sglang_moe_plugins.demo`"
    )
    text = _LINK.sub(lambda m: m.group(1) if m.group(1) == m.group(2) else f"{m.group(1)} ({m.group(2)})", text)
    text = text.replace("## Documentation\n\n", "## Documentation\n\n" + SDIST_NOTE, 1)
    return HEADER + text


def main() -> None:
    (ROOT / "README.pypi.md").write_text(render((ROOT / "README.md").read_text()))


if __name__ == "__main__":
    main()

"""mkdocs hook: a page's links to the code work in the built site too, and break the strict build when they rot.

Pages link to code as GitHub and editors resolve it from docs/ (`[upsert](../src/icelog/archive/upsert.py)`).
mkdocs only knows files under docs/, so such a link would be "not found". This hook copies each linked file of
src/, tests/ or bench/ into the site at its repository path and points the link at the copy; a link to a file that
no longer exists is left alone, and `mkdocs build --strict` fails on it. The pages are flat (no sub-folders).
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

# The target of a Markdown link that leaves docs/ for the code: ](../src/icelog/x.py) or ](../bench/y.py#L3)
CODE_LINK = re.compile(r"\]\(\.\./((?:src|tests|bench)/[^)\s#]+)")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every existing code file a page links to, as a static file at its repository path."""
    root = Path(config.config_file_path).parent
    for page in files.documentation_pages():
        for path in CODE_LINK.findall(page.content_string):
            if (root / path).is_file() and files.get_file_from_path(path) is None:
                files.append(File(path, src_dir=str(root), dest_dir=config.site_dir,
                                  use_directory_urls=config.use_directory_urls))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """`../src/x.py` from a page in docs/ is `src/x.py` in the site's file set."""
    return CODE_LINK.sub(lambda match: "](" + match.group(1), markdown)

"""Symbolic links in a source folder (documents, CDC v2): not read unless the source says so.

A link can point anywhere the process can read: another folder's files (their rows would land) or a
secrets file (its text would reach the dead-letter table, quoted in full). So by default a link
that the source would take as input (by its name) stops the run, naming the link and its target,
before anything is read. ``source.follow_links: true`` reads the links whose targets are regular
files, by the link's name; a link to a folder, a dangling link, or a link to anything else still
stops the run (a linked folder is never walked into: no loops, and nothing beyond the folder is
listed). A link whose name the source never reads (``.x``, ``_x``, documents: a sub-folder) is
passed over like a file of that name.

Why stop rather than skip with a warning: a skipped link whose target was meant as data would lose
its rows, and the epochs would pass its name for good (DESIGN invariant 9: every document lands, or
the run stops naming where the bad input is). Stopping costs a tool that makes links routinely one
change of configuration, said in the message; skipping would cost a user who linked a data file its
rows, said only in a log line.
"""

from __future__ import annotations

from typing import Callable

from materializer.errors import SourceError
from materializer.storage import FileInfo, LinkInfo, Listing


def readable(listing: Listing, wanted: Callable[[str], bool], *, follow: bool, where: str, binding: str) -> list[FileInfo]:
    """The files of ``listing`` to read, sorted by name: its regular files and, with ``follow``, its
    links to regular files (by the link's name, with the target's size). A link ``wanted`` would
    take as input that is not read stops the run (SourceError naming it and what it points to)."""
    refused: list[LinkInfo] = []
    followed: list[FileInfo] = []
    for link in listing.links:
        if not wanted(link.path):
            continue
        if follow and link.kind == "file":
            followed.append(FileInfo(link.path, link.size, link.modified))
        else:
            refused.append(link)
    if refused:
        raise SourceError(_refusal(refused, follow, where, binding), file=f"{where}/{refused[0].path}")
    if not followed:
        return listing.files
    return sorted(listing.files + followed, key=lambda f: f.path)


def _refusal(links: list[LinkInfo], follow: bool, where: str, binding: str) -> str:
    shown = "; ".join(f"{where}/{link.describe()}" for link in links[:3])
    more = f"; and {len(links) - 3} more" if len(links) > 3 else ""
    if follow:
        why = (
            "source.follow_links reads links to files only: a link to a folder is never walked into (it could "
            "loop, or reach beyond the folder), and a dangling one has nothing to read"
        )
        fix = "Remove the link, or put the files themselves (or links to each file) in the folder"
    else:
        why = (
            "a link in a source folder is not read unless the source sets follow_links: true, as it can point "
            "anywhere this process can read (another folder's files, a secrets file)"
        )
        fix = (
            "Replace it with the file itself, remove it (or give it a name starting with '.' or '_', which is "
            "never read), or set source.follow_links: true to read the files links point to"
        )
    return (
        f"binding {binding!r}: symbolic link(s) in the source folder: {shown}{more}. Not read: {why}. {fix}; "
        "nothing was read or applied from this transaction."
    )

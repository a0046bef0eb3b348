"""How what a run reports names documents: by ref (`documents.ref`), never by path.

Dagster keeps what runs report (asset and check metadata, run logs) in its own storage, which `erase` does not
rewrite. A document named there by a number that means nothing once its row is gone leaves no trace of an erased
document's path; `rag-pipeline doc REF` resolves a ref while the document exists, and the CLI resolves the refs in
what it prints. A path that is no document (a name that is not UTF-8, a link out of the root) is shown as it is.
"""

from __future__ import annotations

from typing import Any

NO_DOCUMENT = "(no document)"
SIDECAR_SUFFIX = ".meta.json"  # sources.FILE_SIDECAR_SUFFIX (not imported: this module stays a leaf)
FOLDER_SIDECAR = "_meta.json"  # sources.FOLDER_SIDECAR


def document_name(ref: int | None) -> str:
    return f"#{ref}" if ref is not None else NO_DOCUMENT


def ref_of_name(name: str) -> int | None:
    """The ref a document_name holds, or None for anything else."""
    return int(name[1:]) if name.startswith("#") and name[1:].isdigit() else None


def without_path(value: Any, rel_path: str, name: str) -> Any:
    """A text with the document's path, its sidecar's name (its file name + .meta.json) and the folder sidecars
    above it replaced by its name. Only these: a bare file name as short as `a` would garble the rest of the text."""
    if not isinstance(value, str) or not rel_path:
        return value
    sidecar = rel_path.rsplit("/", 1)[-1] + SIDECAR_SUFFIX
    value = value.replace(rel_path, name).replace(sidecar, name + SIDECAR_SUFFIX)
    # The folder sidecars above it (a held document's reason names the one that cannot be read): named from the
    # document, `#12/../_meta.json` for the one beside it, so that no folder name is kept either. Deepest first.
    folders = rel_path.split("/")[:-1]
    for depth in range(len(folders), 0, -1):
        folder_sidecar = "/".join(folders[:depth]) + "/" + FOLDER_SIDECAR
        value = value.replace(folder_sidecar, name + "/.." * (len(folders) - depth + 1) + "/" + FOLDER_SIDECAR)
    return value


def in_log(source: str, rel_path: str, ref: int | None, message: object = "") -> tuple[str, str]:
    """How a log line names a document (`source #12`) and the message about it, without its path: what a process
    logs may be kept (Dagster's compute logs), and must not outlive the document's erasure."""
    name = document_name(ref)
    return f"{source} {name}", without_path(str(message), rel_path, name)

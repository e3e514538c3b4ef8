"""Stage source: fingerprint the external files ``data.source`` reads (e.g. the npz at ``data.path``) into
data/source.json, and each stage's code (the md5 of every file dvc.yaml's ``meta: code`` lists for it) into
data/code/<stage>.json. DVC runs it every time (``always_changed``, well under a second: no torch, no MLflow)
and reruns ``download`` only when the data fingerprint changes, and a stage only when its code fingerprint does:
a file overwritten in place is never stale, and dvc.lock records one code dep a stage instead of every file."""

import json
import os
import sys
from pathlib import Path

from debias.core.errors import DeclarationError
from debias.core.fingerprint import code_fingerprints, file_digest, tree_digest
from debias.core.errors import uncommitted_params_hint
from debias.core.io import save_json
from debias.core.paths import SOURCE_FINGERPRINT, code_fingerprint_path
from debias.data.sources.base import DataSourceError, external_files, source_digests
from debias.params import ParamsError
from debias.schema import load_params


def fingerprint() -> dict:
    params = load_params().data
    files = {}
    external = external_files(params)
    for key, path in external.items():
        if not path.exists():
            raise DataSourceError(f"{key} = '{path}' does not exist; point {key} at the file")
    own = source_digests(params) if external else {}  # the files the source reads, where a walk would miss some
    for key, path in external.items():
        files[key] = {"value": str(getattr(params, key.removeprefix("data."), path)),
                      "digest": own.get(key) or (tree_digest(path) if path.is_dir() else file_digest(path))}
    return {"source": params.source, "files": files}


def stages(dvc_yaml: Path = Path("dvc.yaml")) -> dict:
    """dvc.yaml's stages, parsed (libyaml where installed)."""
    import yaml

    loaded = yaml.load(dvc_yaml.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return (loaded or {}).get("stages") or {}


def write_if_changed(path: Path, document: dict) -> None:
    """Rewrite ``path`` only when its content would change: an unchanged fingerprint keeps its file (and mtime)."""
    if path.exists() and json.loads(path.read_text()) == json.loads(json.dumps(document)):
        return
    save_json(path, document)


def write_code_fingerprints() -> None:
    """Each stage's code fingerprint, from the files dvc.yaml lists. Only DVC reads them: run outside DVC in a folder
    without those files (the stage commands run by hand beside an installed package), none is written; under DVC a
    missing file is an error naming it (dvc.yaml's lists are out of date)."""
    try:
        documents = code_fingerprints(stages(), Path("."))
    except FileNotFoundError:
        if os.environ.get("DVC_STAGE"):
            raise
        return
    for stage, document in documents.items():
        write_if_changed(code_fingerprint_path(stage), document)


if __name__ == "__main__":
    try:
        write_if_changed(SOURCE_FINGERPRINT, fingerprint())
        write_code_fingerprints()
    except (ParamsError, DataSourceError, DeclarationError, FileNotFoundError) as exc:
        hint = uncommitted_params_hint() if isinstance(exc, ParamsError) else ""
        print(f"[source] error: {str(exc)[:2000]}{hint}", file=sys.stderr)
        sys.exit(2)

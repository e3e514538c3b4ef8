"""Image-file sources: a folder of images with a metadata table, Waterbirds and CelebA.

``imagefolder``  images under ``data.imagefolder.root`` and a table (CSV or parquet) with a path, a
                 class, a bias attribute and optionally a split column; the defaults read the layout
                 of Waterbirds' ``metadata.csv`` (GroupDRO, WILDS: ``img_filename``, ``y``, ``place``,
                 ``split`` 0 / 1 / 2). Without a split column: the seeded stratified split.
``waterbirds``   Sagawa et al.'s Waterbirds, official splits; y = 1 waterbird, a = 1 water background.
                 Fetched as GroupDRO's archive (``data.waterbirds.url``) with torchvision's
                 ``download_and_extract_archive``, not through the ``wilds`` package: wilds 2.0.0 is
                 its last release (December 2021), pins old dependencies, downloads the same images
                 and the same ``metadata.csv`` layout from another host, and would add a package for
                 one ``tar.gz``. A ``waterbirds_v1.0`` folder that wilds already downloaded is read too.
``celeba``       torchvision's CelebA (download for users; it needs ``gdown``). Offline, the files under
                 ``data/raw/celeba/celeba/`` are read directly: ``img_align_celeba/``,
                 ``list_attr_celeba.txt`` and ``list_eval_partition.txt`` (torchvision's CelebA with
                 ``download=False`` insists on five text files with their official MD5 sums, identity,
                 bbox and landmarks included, which this source does not use). Target and bias attribute
                 from ``data.celeba`` (CNC / JTT: Blond_Hair x Male), the official partition.

Each image is decoded with Pillow (RGB), cut to a square as ``fit`` / ``crop_fraction`` say and
resized once (bilinear, antialiased) to ``data.image_size``, into one uint8 array per split, with
a progress bar; decoding runs on ``DEBIAS_THREADS`` threads (default: one per core).
``data.max_per_split`` is applied before decoding, and loading is refused when the arrays would not
fit in memory (:func:`~debias.data.sources.base.check_memory`): the stage contracts keep every
split in one file, so there is no streaming.
CNC follows GroupDRO's setup on both datasets: torchvision's ImageNet-pretrained ResNet-50 on 224 x 224 images
(``data.image_size: 224``, ``model.name: resnet50``, ``model.pretrained: true``).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from debias.data.sources.base import (SPLITS, DataSourceError, RawSplit, RawSplits, cap_index, check_memory,
                                      check_varies, register_source, stratified_split)
from debias.core import progress
from debias.core.fingerprint import digest, file_digest, files_digest
from debias.core.lazy import lazy_callable, lazy_module
from debias.core.paths import resolve_data_path
from debias.params import CelebAParams, DataParams, ImageFit, ImageFolderParams, WaterbirdsParams

SHOWN = 5  # offending files or values named in an error message; the count says how many more
pd = lazy_module("pandas")  # imported when a table is read, not by every stage that imports the source registry
TABLE_READERS = {".csv": lazy_callable("pandas", "read_csv"), ".parquet": lazy_callable("pandas", "read_parquet"),
                 ".pq": lazy_callable("pandas", "read_parquet")}


@dataclass
class ImageTable:
    """Image files with int64 class ``y`` and attribute ``a`` (None: no attribute column, the data has no bias
    labels), and the rows of each split (None: not given)."""

    paths: list[Path]
    y: np.ndarray
    a: np.ndarray | None
    split: dict[str, np.ndarray] | None
    y_column: str  # the column names and the name of each code, for messages
    y_names: list[str]
    a_column: str | None
    a_names: list[str]


# --------------------------------------------------------------------------- the metadata table


def read_table(path: Path) -> pd.DataFrame:
    """The metadata table at ``path`` (CSV or parquet by suffix); a missing or unreadable file is a DataSourceError."""
    if not path.is_file():
        raise DataSourceError(f"metadata table {path} does not exist; set data.imagefolder.metadata (CSV or parquet)")
    reader = TABLE_READERS.get(path.suffix.lower())
    if reader is None:
        raise DataSourceError(f"metadata table {path}: suffix '{path.suffix}' is not read; allowed: {sorted(TABLE_READERS)}")
    try:
        return reader(path)
    except Exception as exc:
        raise DataSourceError(f"metadata table {path} is not readable ({type(exc).__name__}: {exc})") from None


def require_columns(table: pd.DataFrame, columns: dict[str, str], path: Path) -> None:
    """Every ``param key -> column`` must be in ``table``; the error lists the columns present."""
    missing = {key: column for key, column in columns.items() if column not in table.columns}
    if missing:
        named = ", ".join(f"{key} = '{column}'" for key, column in missing.items())
        raise DataSourceError(f"metadata table {path} has no column for {named}; "
                              f"columns present: {[str(c) for c in table.columns]}")


def _shown(values: list) -> str:
    more = f" and {len(values) - SHOWN} more" if len(values) > SHOWN else ""
    return ", ".join(map(str, values[:SHOWN])) + more


def encode_values(values: pd.Series, names: list[int | str] | None, key: str, role: str,
                  path: Path) -> tuple[np.ndarray, list[str]]:
    """Integer codes 0..K-1 of a label column, and the name of each code.

    With ``names`` (``data.imagefolder.label_values``), value ``names[i]`` becomes ``i`` (compared as text)
    and any other value is an error. Without, the column must hold integers >= 0; other values are
    refused with the ``names`` line that would map them; ``role`` (y or a) is what the codes become.
    """
    column = values.name
    if values.isna().any():
        rows = np.flatnonzero(values.isna().to_numpy()).tolist()
        raise DataSourceError(f"metadata table {path}: column '{column}' is empty in {len(rows)} row(s) (rows {_shown(rows)})")
    if names is not None:
        lookup = {str(name): code for code, name in enumerate(names)}
        text = values.astype(str)
        unknown = sorted(set(text) - set(lookup))
        if unknown:
            raise DataSourceError(f"metadata table {path}: column '{column}' holds {_shown(unknown)}, not in {key} = {names}")
        present = set(text)
        unmatched = [name for name in names if str(name) not in present]
        if unmatched:  # a misspelt name would leave a class (or attribute) without any image
            raise DataSourceError(f"{key} names {_shown(unmatched)}, which no row of metadata table {path} holds in "
                                  f"column '{column}'; the values present: {_shown(sorted(present))}")
        return text.map(lookup).to_numpy(np.int64), [str(n) for n in names]
    numeric = pd.to_numeric(values, errors="coerce")
    if numeric.isna().any() or not np.all(np.mod(numeric.to_numpy(float), 1) == 0):
        distinct = sorted(set(values.astype(str)))
        raise DataSourceError(
            f"metadata table {path}: column '{column}' holds non-integer values ({_shown(distinct)}); set {key} to "
            f"their names in class order, e.g. {key}: [{', '.join(distinct[:SHOWN])}] (the i-th name becomes {role} = i)")
    codes = numeric.to_numpy(np.int64)
    if codes.min() < 0:
        raise DataSourceError(f"metadata table {path}: column '{column}' holds negative values (min {codes.min()}); "
                              "allowed: 0, 1, ..., K-1")
    return codes, [str(v) for v in range(int(codes.max()) + 1)]


def split_rows(values: pd.Series, split_values: dict[str, int | str], path: Path) -> dict[str, np.ndarray]:
    """Rows of each split from the split column (compared as text); a value no split claims is an error."""
    text = values.astype(str).to_numpy()
    index = {name: np.flatnonzero(text == str(split_values[name])) for name in SPLITS}
    claimed = np.zeros(len(text), dtype=bool)
    for rows in index.values():
        claimed[rows] = True
    if not claimed.all():
        stray = sorted(set(text[~claimed]))
        raise DataSourceError(f"metadata table {path}: column '{values.name}' holds {_shown(stray)}, which no split claims; "
                              f"data.imagefolder.split_values = {split_values}")
    unmatched = [f"{name}: {split_values[name]}" for name in SPLITS if len(index[name]) == 0]
    if unmatched:
        raise DataSourceError(f"data.imagefolder.split_values ({', '.join(unmatched)}) matches no row of metadata table "
                              f"{path}; column '{values.name}' holds {_shown(sorted(set(text)))}")
    return index


def table_path(spec: ImageFolderParams, root: Path) -> Path:
    """The metadata table: ``data.imagefolder.metadata`` as given when absolute, else under ``root``."""
    return Path(spec.metadata) if Path(spec.metadata).is_absolute() else root / spec.metadata


def check_unique(paths: list[Path], column: str, table: Path) -> None:
    """Every image is listed once (paths compared resolved: ``a.png``, ``./a.png`` and a link to it are one image);
    a repeated row would put the same image in two splits, or weigh it twice."""
    rows: dict[Path, list[int]] = {}
    for row, path in enumerate(paths):
        rows.setdefault(Path(os.path.realpath(path)), []).append(row)
    repeated = [(path, found) for path, found in rows.items() if len(found) > 1]
    if repeated:
        shown = [f"{paths[found[0]]} (rows {', '.join(map(str, found[:SHOWN]))})" for _, found in repeated]
        raise DataSourceError(f"metadata table {table} lists {len(repeated)} image(s) more than once in column "
                              f"'{column}': {_shown(shown)}; each image may be listed once (a repeated image can land "
                              "in train and test): drop the repeated rows")


def table_from_metadata(spec: ImageFolderParams, root: Path) -> ImageTable:
    """Read and check ``spec``'s metadata table: columns, labels, attributes, splits and that every file exists."""
    path = table_path(spec, root)
    table = read_table(path)
    columns = {"data.imagefolder.path_column": spec.path_column, "data.imagefolder.label_column": spec.label_column}
    if spec.attribute_column is not None:
        columns["data.imagefolder.attribute_column"] = spec.attribute_column
    if spec.split_column is not None:
        columns["data.imagefolder.split_column"] = spec.split_column
    require_columns(table, columns, path)
    if len(table) == 0:
        raise DataSourceError(f"metadata table {path} has no rows")
    y, y_names = encode_values(table[spec.label_column], spec.label_values, "data.imagefolder.label_values", "y", path)
    a, a_names = (None, []) if spec.attribute_column is None else encode_values(
        table[spec.attribute_column], spec.attribute_values, "data.imagefolder.attribute_values", "a", path)
    split = split_rows(table[spec.split_column], spec.split_values, path) if spec.split_column is not None else None
    paths = [root / str(name) for name in table[spec.path_column]]
    check_unique(paths, spec.path_column, path)
    rows = f"the {len(table)} rows of metadata table {path}"
    check_varies(y, "y", f"column '{spec.label_column}' (data.imagefolder.label_column)", rows)  # before decoding
    if a is not None:
        check_varies(a, "a", f"column '{spec.attribute_column}' (data.imagefolder.attribute_column)", rows)
    return ImageTable(paths, y, a, split, spec.label_column, y_names, spec.attribute_column, a_names)


def check_files_exist(paths: list[Path]) -> None:
    """Every image file must exist; the error names the first few missing and how many."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataSourceError(f"{len(missing)} of {len(paths)} image file(s) are missing: {_shown(missing)}")


def check_coverage(index: dict[str, np.ndarray], codes: np.ndarray, column: str, names: list[str]) -> None:
    """Every split must hold every value of ``column`` (a class or attribute absent from a split is an error)."""
    for split, rows in index.items():
        absent = sorted(set(range(len(names))) - set(np.unique(codes[rows]).tolist()))
        if absent:
            shown = ", ".join(f"{code} ({names[code]})" if names[code] != str(code) else str(code) for code in absent)
            raise DataSourceError(f"split '{split}' has no image with {column} = {shown}; every split needs every "
                                  f"value of '{column}' (raise data.max_per_split or check the split column)")


# --------------------------------------------------------------------------- decoding


def fit_box(width: int, height: int, fit: ImageFit, crop_fraction: float) -> tuple[float, float, float, float]:
    """The central region (left, top, right, bottom) of a ``width`` x ``height`` image that becomes the square."""
    if fit == "center_square":
        width_kept = height_kept = min(width, height) * crop_fraction
    else:
        width_kept, height_kept = width * crop_fraction, height * crop_fraction
    left, top = (width - width_kept) / 2, (height - height_kept) / 2
    return left, top, left + width_kept, top + height_kept


# Pillow's modes of 16-bit grey images (PNG, TIFF): values 0..65535. Its convert("RGB") clips them at 255.
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N")
# Modes whose value range the file does not say (32-bit integers, floats): refused rather than guessed.
UNSCALED_MODES = {"I": "32-bit integer", "F": "32-bit float"}


def to_rgb(image: Image.Image, path: Path) -> Image.Image:
    """The image as 8-bit RGB: 16-bit grey scaled by its type's range, ``round(v * 255 / 65535)``; other modes by Pillow."""
    if image.mode in SIXTEEN_BIT_MODES:
        grey = np.asarray(image).astype(np.float64) * (255 / 65535)
        return Image.fromarray(np.round(grey).astype(np.uint8), mode="L").convert("RGB")
    if image.mode in UNSCALED_MODES:
        raise DataSourceError(f"{path}: mode {image.mode} ({UNSCALED_MODES[image.mode]} pixels) has no known value "
                              "range to map to 0..255; allowed: 8-bit images (L, RGB, RGBA, P, ...) and 16-bit grey "
                              f"({', '.join(SIXTEEN_BIT_MODES)})")
    return image.convert("RGB")


def decode_image(path: Path, size: int, fit: ImageFit, crop_fraction: float) -> np.ndarray:
    """RGB uint8 ``[size, size, 3]``: the ``fit`` region of the image at ``path``, resized bilinearly (antialiased)."""
    with Image.open(path) as image:
        rgb = to_rgb(image, path)
        box = fit_box(rgb.width, rgb.height, fit, crop_fraction)
        return np.asarray(rgb.resize((size, size), Image.Resampling.BILINEAR, box=box), dtype=np.uint8)


def decode_threads() -> int:
    """``DEBIAS_THREADS`` when set (machine setting, as for torch), else the cores this process may use."""
    wanted = os.environ.get("DEBIAS_THREADS", "")
    if wanted.isascii() and wanted.isdigit() and int(wanted) >= 1:  # '²'.isdigit() is True; int('²') fails
        return int(wanted)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def decode_images(paths: list[Path], size: int, fit: ImageFit, crop_fraction: float, desc: str) -> np.ndarray:
    """uint8 ``[N, size, size, 3]``; unreadable files are collected and named together (first few and count)."""
    out = np.empty((len(paths), size, size, 3), dtype=np.uint8)
    failures: list[tuple[Path, str]] = []

    def one(i: int) -> None:
        try:
            out[i] = decode_image(paths[i], size, fit, crop_fraction)
        except Exception as exc:  # PIL.UnidentifiedImageError, OSError on truncated files, ...
            failures.append((paths[i], f"{type(exc).__name__}: {exc}"))

    with ThreadPoolExecutor(max_workers=decode_threads()) as pool:
        for done, _ in enumerate(pool.map(one, range(len(paths))), start=1):
            progress.advance(desc, done, len(paths), unit="img")
    if failures:
        failures.sort()
        raise DataSourceError(f"{desc}: {len(failures)} of {len(paths)} image file(s) could not be decoded: "
                              f"{_shown([str(p) for p, _ in failures])} (first: {failures[0][1]})")
    return out


def decode_splits(table: ImageTable, fit: ImageFit, crop_fraction: float, params: DataParams, seed: int) -> RawSplits:
    """Split (given or seeded stratified), cap, check memory and coverage, then decode each split."""
    index = table.split if table.split is not None else stratified_split(table.y, params.val_fraction, params.test_fraction, seed)
    index = cap_index({name: index[name] for name in SPLITS}, params.max_per_split, seed)
    for name in SPLITS:
        if len(index[name]) == 0:
            raise DataSourceError(f"split '{name}' is empty for data.source = '{params.source}'")
    check_coverage(index, table.y, table.y_column, table.y_names)
    if table.a is not None:
        check_coverage(index, table.a, str(table.a_column), table.a_names)
    check_files_exist([table.paths[i] for rows in index.values() for i in rows])
    check_memory(sum(len(rows) for rows in index.values()), params.image_size, params)
    return {
        name: RawSplit(decode_images([table.paths[i] for i in rows], params.image_size, fit, crop_fraction,
                                     f"{params.source} {name}"), table.y[rows],
                             None if table.a is None else table.a[rows])
        for name, rows in index.items()
    }


# --------------------------------------------------------------------------- sources


def imagefolder_files(params: DataParams) -> dict[str, Path]:
    """The folder the source stage checks exists (its fingerprint: :func:`imagefolder_digests`)."""
    return {"data.imagefolder.root": resolve_data_path(params.imagefolder.root or "")}


def imagefolder_digests(params: DataParams) -> dict[str, str]:
    """The fingerprint of exactly what the source reads: the metadata table's bytes (wherever it is) and each
    image it names, through links and ``..`` (resolved path, size, modification time); an image or the table
    changed in place reruns ``download``. Walking the folder instead missed linked folders, images outside
    the root and a table elsewhere."""
    spec = params.imagefolder
    root = resolve_data_path(spec.root or "")
    path = table_path(spec, root)
    table = read_table(path)
    require_columns(table, {"data.imagefolder.path_column": spec.path_column}, path)
    images = files_digest([root / str(name) for name in table[spec.path_column]])
    return {"data.imagefolder.root": digest([str(path.resolve()), file_digest(path), images])}


def check_imagefolder(params: DataParams) -> str:
    """What ``debias check-params`` checks of an image folder, cheaply (no image is decoded): the root is a folder,
    the table reads and has the named columns, labels, attributes and splits are valid, no image is listed twice
    and every image exists. Returns a one-line summary; a failure is a DataSourceError."""
    spec = params.imagefolder
    root = resolve_data_path(spec.root or "")
    if not root.is_dir():
        raise DataSourceError(f"data.imagefolder.root = '{root}' is not a folder; point it at the folder of images")
    table = table_from_metadata(spec, root)
    check_files_exist(table.paths)
    return f"{len(table.paths)} images listed in {table_path(spec, root)}, all present"


def imagefolder_values(params: DataParams) -> dict[str, str]:
    spec = params.imagefolder
    return {"y": f"column '{spec.label_column}' (data.imagefolder.label_column)",
            "a": f"column '{spec.attribute_column}' (data.imagefolder.attribute_column)"}


@register_source("imagefolder", protocol="given", files=imagefolder_files, digests=imagefolder_digests,
                 values=imagefolder_values)
def imagefolder_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """A folder of images and a metadata table (``data.imagefolder``; a relative root is resolved against the
    repository root, as under ``dvc exp run --temp`` and the queue)."""
    spec = params.imagefolder
    assert spec.root is not None  # the schema requires it for this source
    root = resolve_data_path(spec.root)
    if not root.is_dir():
        raise DataSourceError(f"data.imagefolder.root = '{root}' is not a folder; point it at the folder of images")
    return decode_splits(table_from_metadata(spec, root), spec.fit, spec.crop_fraction, params, seed)


# Folders holding Waterbirds' metadata.csv and images: GroupDRO's archive, then the one wilds downloads.
WATERBIRDS_FOLDERS = ("waterbird_complete95_forest2water2", "waterbirds_v1.0")


def waterbirds_spec(folder: Path, params: WaterbirdsParams) -> ImageFolderParams:
    """Waterbirds' metadata.csv: img_filename, y (1 = waterbird), place (1 = water), split 0 / 1 / 2."""
    return ImageFolderParams(root=str(folder), metadata="metadata.csv", path_column="img_filename", label_column="y",
                             attribute_column="place", split_column="split",
                             split_values={"train": 0, "val": 1, "test": 2},
                             fit=params.fit, crop_fraction=params.crop_fraction)


def find_waterbirds(root: Path) -> Path | None:
    """The first of :data:`WATERBIRDS_FOLDERS` under ``root`` that holds a metadata.csv."""
    return next((root / name for name in WATERBIRDS_FOLDERS if (root / name / "metadata.csv").is_file()), None)


@register_source("waterbirds", protocol="given",
                 values=lambda params: {"y": "Waterbirds' column 'y'", "a": "Waterbirds' column 'place'"})
def waterbirds_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """Waterbirds from ``data/raw/waterbirds`` (downloaded and extracted there when absent), official splits."""
    root = raw_dir / "waterbirds"
    folder = find_waterbirds(root)
    if folder is None:
        from torchvision.datasets.utils import download_and_extract_archive

        try:
            download_and_extract_archive(params.waterbirds.url, download_root=str(root))
        except Exception as exc:  # URLError, HTTPError, tarfile errors, ...
            raise DataSourceError(
                f"data.source=waterbirds: {params.waterbirds.url} could not be downloaded into {root} "
                f"({type(exc).__name__}: {exc}). Without network, extract waterbird_complete95_forest2water2.tar.gz "
                f"into {root}/ (giving {root}/{WATERBIRDS_FOLDERS[0]}/metadata.csv and the image folders), or use "
                "data.source=imagefolder with data.imagefolder.root at a copy elsewhere") from None
        folder = find_waterbirds(root)
        if folder is None:
            raise DataSourceError(f"data.source=waterbirds: the archive from {params.waterbirds.url} holds no "
                                  f"{'/'.join(WATERBIRDS_FOLDERS)}/metadata.csv under {root}")
    spec = waterbirds_spec(folder, params.waterbirds)
    return decode_splits(table_from_metadata(spec, folder), spec.fit, spec.crop_fraction, params, seed)


# CelebA's files this source reads, under data/raw/celeba/celeba/ (torchvision's layout).
CELEBA_IMAGES = "img_align_celeba"
CELEBA_ATTRS = "list_attr_celeba.txt"
CELEBA_PARTITION = "list_eval_partition.txt"


def read_celeba_attributes(path: Path) -> pd.DataFrame:
    """list_attr_celeba.txt: a count line, a header of attribute names, then ``name v1 ... v40`` with v = -1 / 1."""
    try:
        with open(path) as handle:
            handle.readline()
            header = handle.readline().split()
        table = pd.read_csv(path, sep=r"\s+", skiprows=2, header=None, names=["image", *header], dtype={"image": str})
    except Exception as exc:
        raise DataSourceError(f"{path} is not CelebA's attribute list ({type(exc).__name__}: {exc})") from None
    values = table[header].to_numpy()
    if not np.isin(values, (-1, 1)).all():
        raise DataSourceError(f"{path}: attribute values must be -1 or 1 (CelebA's list_attr_celeba.txt)")
    return table.set_index("image")


def read_celeba_partition(path: Path) -> pd.Series:
    """list_eval_partition.txt: ``name split`` with split 0 train, 1 valid, 2 test."""
    try:
        table = pd.read_csv(path, sep=r"\s+", header=None, names=["image", "partition"], dtype={"image": str})
    except Exception as exc:
        raise DataSourceError(f"{path} is not CelebA's partition list ({type(exc).__name__}: {exc})") from None
    return table.set_index("image")["partition"]


def celeba_files_present(folder: Path) -> bool:
    return (folder / CELEBA_IMAGES).is_dir() and (folder / CELEBA_ATTRS).is_file() and (folder / CELEBA_PARTITION).is_file()


def celeba_table(folder: Path, params: CelebAParams) -> ImageTable:
    """Target and attribute columns of CelebA's attribute list (-1 / 1 to 0 / 1), official partition."""
    attributes = read_celeba_attributes(folder / CELEBA_ATTRS)
    require_columns(attributes, {"data.celeba.target": params.target, "data.celeba.attribute": params.attribute},
                    folder / CELEBA_ATTRS)
    partition = read_celeba_partition(folder / CELEBA_PARTITION)
    unlisted = sorted(set(partition.index) - set(attributes.index))
    if unlisted:
        raise DataSourceError(f"{folder / CELEBA_PARTITION} names {len(unlisted)} image(s) that {CELEBA_ATTRS} lacks: {_shown(unlisted)}")
    rows = attributes.loc[partition.index]
    codes = partition.to_numpy()
    split = {name: np.flatnonzero(codes == code) for code, name in enumerate(SPLITS)}
    stray = sorted(set(codes.tolist()) - {0, 1, 2})
    if stray:
        raise DataSourceError(f"{folder / CELEBA_PARTITION}: partition values {stray}; allowed: 0 (train), 1 (valid), 2 (test)")
    y = (rows[params.target].to_numpy() > 0).astype(np.int64)
    a = (rows[params.attribute].to_numpy() > 0).astype(np.int64)
    paths = [folder / CELEBA_IMAGES / name for name in partition.index]
    check_unique(paths, "image", folder / CELEBA_PARTITION)  # a name listed twice would sit in two partitions
    return ImageTable(paths, y, a, split, params.target, [f"not {params.target}", params.target],
                      params.attribute, [f"not {params.attribute}", params.attribute])


@register_source("celeba", protocol="given",
                 values=lambda params: {"y": f"data.celeba.target = '{params.celeba.target}'",
                                        "a": f"data.celeba.attribute = '{params.celeba.attribute}'"})
def celeba_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """CelebA from ``data/raw/celeba/celeba`` (torchvision downloads it when absent), official partition."""
    root = raw_dir / "celeba"
    folder = root / "celeba"  # torchvision's CelebA.base_folder
    if not celeba_files_present(folder):
        from torchvision.datasets import CelebA

        try:
            CelebA(str(root), split="all", target_type="attr", download=True)
        except Exception as exc:  # gdown missing, Google Drive quota, URLError, checksum failures, ...
            raise DataSourceError(
                f"data.source=celeba: CelebA could not be downloaded into {folder} ({type(exc).__name__}: {exc}). "
                "torchvision downloads it from Google Drive with gdown (pip install gdown). Without network, put "
                f"{CELEBA_IMAGES}/ (the extracted img_align_celeba.zip), {CELEBA_ATTRS} and {CELEBA_PARTITION} "
                f"into {folder}/") from None
    table = celeba_table(folder, params.celeba)
    return decode_splits(table, params.celeba.fit, params.celeba.crop_fraction, params, seed)

"""Tabular fairness sources: UCI Adult (sensitive attribute sex) and ProPublica COMPAS (race).

The WCL paper's fairness benchmarks (difficulty-based sampling paper, Sec. 6.2, Table 3): an
MLP on feature vectors, the sensitive attribute is the bias attribute ``a`` (``bias.protocol``
``auto`` resolves to ``given`` for these sources), random 70/15/15 train/val/test splits.

Files. ``data/raw/<name>/`` holds the dataset's original files. Missing ones are downloaded with
urllib from their public locations (:data:`ADULT_FILES`, :data:`COMPAS_FILES`) and their sha256
checked; files already there are used as they are, so a machine without network runs once
they are placed (a failed download is a :class:`DataSourceError` naming the folder and files).
``data.path`` (optional) names another folder holding the original files, read in place and never
downloaded into: ``dvc exp run`` checks ``data/raw`` out from DVC's cache (removing files placed there
by hand) and queued experiments run in temporary copies without it, so offline experiments point
``data.path`` at the files (e.g. ``../shared/datasets/adult``); the ``source`` stage fingerprints them.

``adult``   ``adult.data`` (32,561 rows) and ``adult.test`` (16,281 rows; first line
            ``|1x3 Cross validator``, labels end in ``.``), pooled. Rows with a missing value
            (``?``: workclass, occupation, native-country) are dropped: 45,222 rows remain.
            Label ``y`` = 1 for income ``>50K`` (the test file's trailing ``.`` stripped), else 0.
            Attribute ``a`` = sex: 0 = Female, 1 = Male.
            Features: the 14 original attributes (WCL: "14 features"); numerics age, fnlwgt,
            education-num, capital-gain, capital-loss, hours-per-week; categoricals workclass,
            education, marital-status, occupation, relationship, race, sex, native-country.
``compas``  ``compas-scores-two-years.csv`` (7,214 rows) through ProPublica's filter (their
            compas-analysis notebook): ``-30 <= days_b_screening_arrest <= 30`` (rows without the
            value dropped), ``is_recid != -1``, ``c_charge_degree != 'O'``, ``score_text != 'N/A'``:
            6,172 rows. Then the usual binary restriction to African-American and Caucasian
            defendants (``data.tabular.compas_races``; rows of other races dropped; ProPublica's
            analysis and most fairness work on COMPAS compare these two; the WCL paper names race
            without saying more): 5,278 rows. Label ``y`` = ``two_year_recid`` (1 = rearrested
            within two years). Attribute ``a`` = the race's position in ``compas_races``: by
            default 0 = African-American, 1 = Caucasian.
            Features, as the fairness literature uses them: numerics age, priors_count,
            juv_fel_count, juv_misd_count, juv_other_count; categoricals sex, race,
            c_charge_degree. The COMPAS score itself (decile_score, score_text) is not a feature.

Encoding (both): categoricals one-hot, one 0/1 column ``column=value`` per value present in the
filtered table (sorted; the vocabulary is schema, not a statistic, so a value only seen in val
or test still has its column); numerics standardised with the mean and standard deviation of the
training split only (a constant column: std 1). Columns: the numerics, then the one-hots in the
order listed. The sensitive attribute stays a feature by default (the usual setting, and WCL's
14 Adult features include sex); ``data.tabular.keep_sensitive_feature: false`` drops its
columns ("fairness through unawareness"); ``a`` is kept either way.

Splits: a seeded random permutation (``seed``), ``data.tabular.test_fraction`` (15 %) and
``data.tabular.val_fraction`` (15 %) of the rows, the rest (70 %) for training, as WCL's "randomly
split ... 70%, 15%, 15%"; not stratified. ``data.val_fraction`` / ``data.test_fraction`` (the digit
sources' stratified fractions) and ``data.image_size`` do not apply; ``data.max_per_split`` does
(after standardisation, so the statistics are those of the whole training split).
"""

from __future__ import annotations

import hashlib
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from debias.core.fingerprint import digest, file_digest
from debias.core.io import atomic_path
from debias.core.lazy import lazy_module
from debias.core.paths import resolve_data_path
from debias.data.sources.base import DataSourceError, RawSplit, RawSplits, random_split, register_source
from debias.params import DataParams, TabularParams

pd = lazy_module("pandas")  # imported when a table is read, not by every stage that imports the source registry

DOWNLOAD_TIMEOUT_S = 60


@dataclass(frozen=True)
class RemoteFile:
    """One original file of a dataset: its name in ``data/raw/<source>/``, public URL, sha256, its rows of data
    and the other non-empty lines (a header, adult.test's ``|1x3 Cross validator``), as published."""

    name: str
    url: str
    sha256: str
    rows: int
    other_lines: int = 0


@dataclass(frozen=True)
class TableSpec:
    """Which columns of a cleaned table become features, and which one is the sensitive attribute."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    sensitive: str


UCI_ADULT = "https://archive.ics.uci.edu/ml/machine-learning-databases/adult"
ADULT_FILES = (
    RemoteFile("adult.data", f"{UCI_ADULT}/adult.data", "5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
               32561),
    RemoteFile("adult.test", f"{UCI_ADULT}/adult.test", "a2a9044bc167a35b2361efbabec64e89d69ce82d9790d2980119aac5fd7e9c05",
               16281, other_lines=1),
)
COMPAS_FILES = (
    RemoteFile("compas-scores-two-years.csv",
               "https://raw.githubusercontent.com/propublica/compas-analysis/master/compas-scores-two-years.csv",
               "c451db85908b2f7fef1d83203bedf6b71ecda0d5af468d82ae62178f91d0cc7d", 7214, other_lines=1),
)

ADULT_COLUMNS = ("age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
                 "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
                 "income")
ADULT_SPEC = TableSpec(
    numeric=("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"),
    categorical=("workclass", "education", "marital-status", "occupation", "relationship", "race", "sex",
                 "native-country"),
    sensitive="sex",
)
ADULT_LABELS = {"<=50K": 0, ">50K": 1}
ADULT_SEX = {"Female": 0, "Male": 1}

COMPAS_SPEC = TableSpec(
    numeric=("age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count"),
    categorical=("sex", "race", "c_charge_degree"),
    sensitive="race",
)
COMPAS_FILTER_COLUMNS = ("days_b_screening_arrest", "is_recid", "c_charge_degree", "score_text")
COMPAS_SCREENING_WINDOW = 30  # ProPublica: charge within 30 days of the COMPAS screening


# --------------------------------------------------------------------------- files


def source_folder(params: DataParams, raw_dir: Path, source: str) -> tuple[Path, bool]:
    """Where the original files are: ``data.path`` (read in place, never downloaded into) or ``raw_dir/<source>``
    (missing files downloaded); and whether missing files may be downloaded."""
    if params.path:
        return resolve_data_path(params.path), False
    return raw_dir / source, True


def path_files(params: DataParams) -> dict[str, Path]:
    """The external folder the source stage fingerprints: ``data.path`` when set."""
    return {"data.path": resolve_data_path(params.path)} if params.path else {}


DATASET_FILES: dict[str, tuple[RemoteFile, ...]] = {}  # filled below: the original files of each source


def path_digests(params: DataParams) -> dict[str, str]:
    """The fingerprint of ``data.path``: the bytes of the dataset's files the source reads there (links followed),
    not a walk of the folder (other files in it do not matter; a linked file's change does)."""
    if not params.path:
        return {}
    folder = resolve_data_path(params.path)
    entries = [[remote.name, file_digest(folder / remote.name) if (folder / remote.name).is_file() else "missing"]
               for remote in DATASET_FILES[params.source]]
    return {"data.path": digest(entries)}


def sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            hasher.update(block)
    return hasher.hexdigest()


def count_rows(path: Path, remote: RemoteFile) -> int:
    """Rows of data in ``path``: its non-empty lines but the published file's other lines (header, comment)."""
    with open(path, "rb") as handle:
        return sum(1 for line in handle if line.strip()) - remote.other_lines


def verify_files(paths: Sequence[Path], files: Sequence[RemoteFile], source: str, params: TabularParams) -> None:
    """Each file must be the published one (its sha256), unless ``data.tabular.verify_sha256`` is false; the error
    says how many rows it holds against the published count (a copy cut at a line boundary reads without error)."""
    if not params.verify_sha256:
        return
    for path, remote in zip(paths, files):
        actual = sha256_of(path)
        if actual == remote.sha256:
            continue
        rows = count_rows(path, remote)
        what = (f"holds {rows:,} rows of data where the published file has {remote.rows:,}: it looks truncated"
                if rows < remote.rows else f"holds {rows:,} rows of data (published: {remote.rows:,}): another version")
        raise DataSourceError(
            f"data.source={source}: {path} is not the published {remote.name} (sha256 {actual[:16]}..., expected "
            f"{remote.sha256[:16]}...); it {what}. Put the original there ({remote.url}), or set "
            "data.tabular.verify_sha256: false to read a file changed on purpose")


def fetch_files(folder: Path, files: Sequence[RemoteFile], source: str, download: bool = True) -> list[Path]:
    """The files' paths in ``folder``; missing ones are downloaded (sha256 checked), present ones used as they are.

    ``download=False`` (``data.path``): a missing file is an error naming it."""
    for remote in files:
        target = folder / remote.name
        if target.exists():
            continue
        if not download:
            raise DataSourceError(f"data.source={source}: data.path = '{folder}' lacks {remote.name}; put the original "
                                  f"files ({', '.join(f.name for f in files)}) there, or set data.path: null to use "
                                  f"data/raw/{source}/ (downloaded when missing)")
        try:
            with urllib.request.urlopen(remote.url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                payload = response.read()
        except Exception as exc:  # URLError, HTTPError, timeouts, ...
            names = ", ".join(f.name for f in files)
            raise DataSourceError(
                f"data.source={source}: {remote.url} could not be downloaded into {folder} "
                f"({type(exc).__name__}: {exc}). Without network, put the original files ({names}) into {folder}/"
            ) from None
        digest = hashlib.sha256(payload).hexdigest()
        if digest != remote.sha256:
            raise DataSourceError(
                f"data.source={source}: the download of {remote.url} has sha256 {digest}, expected {remote.sha256}; "
                f"nothing was written. Put the original {remote.name} into {folder}/ by hand"
            )
        with atomic_path(target) as tmp:
            tmp.write_bytes(payload)
    return [folder / remote.name for remote in files]


def _read_csv(path: Path, source: str, **options: object) -> pd.DataFrame:
    try:
        return pd.read_csv(path, **options)
    except Exception as exc:
        raise DataSourceError(f"data.source={source}: {path} is not readable as CSV ({type(exc).__name__}: {exc})") from None


def _require_values(values: pd.Series, allowed: set, what: str, path: str, source: str) -> None:
    unknown = sorted(set(values.unique().tolist()) - allowed, key=str)
    if unknown:
        raise DataSourceError(f"data.source={source}: {path}: {what} holds {unknown[:5]}; allowed: {sorted(allowed)}")


# --------------------------------------------------------------------------- Adult


def read_adult(path: Path) -> pd.DataFrame:
    """One UCI Adult file as a table: values stripped, '?' as missing, '|' lines skipped, the label's '.' stripped."""
    frame = _read_csv(path, "adult", header=None, names=list(ADULT_COLUMNS), skipinitialspace=True,
                      na_values=["?"], keep_default_na=False, comment="|", skip_blank_lines=True)
    check_complete_rows(frame, path, "adult", "income")
    frame["income"] = frame["income"].astype(str).str.strip().str.rstrip(".")
    return frame


def check_complete_rows(frame: pd.DataFrame, path: Path, source: str, last_column: str) -> None:
    """Every row reaches the last column (never empty in the published file): a row that ends early names its
    data row, and the last one says the file looks truncated (a copy cut mid-line)."""
    last = frame[last_column]
    short = np.flatnonzero((last.isna() | (last.astype(str).str.strip() == "")).to_numpy())
    if len(short) == 0:
        return
    row = int(short[0])
    cut = " (the last row: the file looks truncated mid-line)" if row == len(frame) - 1 else ""
    raise DataSourceError(f"data.source={source}: {path}: data row {row + 1:,} of {len(frame):,} ends before column "
                          f"{last_column}{cut}; put the original file there")


def clean_adult(frame: pd.DataFrame, where: str = "adult") -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Rows with a missing value dropped; ``(table, y = income >50K, a = sex (0 Female, 1 Male))``."""
    frame = frame.dropna()
    _require_values(frame["income"], set(ADULT_LABELS), "income", where, "adult")
    _require_values(frame["sex"], set(ADULT_SEX), "sex", where, "adult")
    for column in ADULT_SPEC.numeric:
        frame[column] = _numeric(frame[column], column, where, "adult")
    frame = frame.reset_index(drop=True)
    y = frame["income"].map(ADULT_LABELS).to_numpy(np.int64)
    a = frame["sex"].map(ADULT_SEX).to_numpy(np.int64)
    return frame, y, a


@register_source("adult", protocol="given", files=path_files, digests=path_digests,
                 values=lambda params: {"y": "adult's income label (>50K)", "a": "adult's attribute sex"})
def adult_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """UCI Adult (adult.data + adult.test pooled), sensitive attribute sex; see the module docstring."""
    folder, download = source_folder(params, raw_dir, "adult")
    paths = fetch_files(folder, ADULT_FILES, "adult", download)
    verify_files(paths, ADULT_FILES, "adult", params.tabular)
    frame, y, a = clean_adult(pd.concat([read_adult(path) for path in paths], ignore_index=True),
                              " + ".join(str(p) for p in paths))
    return tabular_splits(frame, y, a, ADULT_SPEC, params.tabular, seed, "adult")


# --------------------------------------------------------------------------- COMPAS


def read_compas(path: Path) -> pd.DataFrame:
    """ProPublica's CSV as a table; only empty fields are missing ("N/A" is a score_text value the filter drops)."""
    frame = _read_csv(path, "compas", keep_default_na=False, na_values=[""])
    if "two_year_recid" in frame.columns and frame.columns[-1] == "two_year_recid":
        check_complete_rows(frame, path, "compas", "two_year_recid")
    return frame


def propublica_filter(frame: pd.DataFrame) -> pd.Series:
    """ProPublica's rows: screening within 30 days of the arrest, a known recidivism outcome, no ordinary
    traffic offence ('O') and a COMPAS score (boolean mask; a missing days value fails the window)."""
    days = pd.to_numeric(frame["days_b_screening_arrest"], errors="coerce")
    is_recid = pd.to_numeric(frame["is_recid"], errors="coerce")
    return ((days >= -COMPAS_SCREENING_WINDOW) & (days <= COMPAS_SCREENING_WINDOW) & (is_recid != -1)
            & (frame["c_charge_degree"] != "O") & (frame["score_text"] != "N/A"))


def clean_compas(frame: pd.DataFrame, races: Sequence[str], where: str = "compas") -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """ProPublica's filter, then the rows of ``races``; ``(table, y = two_year_recid, a = position of the race)``."""
    needed = sorted(set(COMPAS_FILTER_COLUMNS) | set(COMPAS_SPEC.numeric) | set(COMPAS_SPEC.categorical)
                    | {"two_year_recid"})
    missing = [column for column in needed if column not in frame.columns]
    if missing:
        raise DataSourceError(f"data.source=compas: {where} lacks the column(s) {missing}; "
                              "expected ProPublica's compas-scores-two-years.csv")
    frame = frame[propublica_filter(frame)]
    present = sorted(set(frame["race"].astype(str)))
    unmatched = [race for race in races if race not in present]
    if unmatched:  # a misspelt race would leave one attribute value: every fairness number meaningless
        raise DataSourceError(f"data.tabular.compas_races names {unmatched}, which no row of {where} holds after "
                              f"ProPublica's filter; the races present: {present}")
    frame = frame[frame["race"].isin(list(races))]
    for column in (*COMPAS_SPEC.numeric, "two_year_recid"):
        frame[column] = _numeric(frame[column], column, where, "compas")
    frame = frame.reset_index(drop=True)
    _require_values(frame["two_year_recid"], {0, 1}, "two_year_recid", where, "compas")
    y = frame["two_year_recid"].to_numpy(np.int64)
    a = frame["race"].map({race: index for index, race in enumerate(races)}).to_numpy(np.int64)
    return frame, y, a


@register_source("compas", protocol="given", files=path_files, digests=path_digests,
                 values=lambda params: {"y": "compas' label two_year_recid",
                                        "a": f"compas' race (data.tabular.compas_races = {params.tabular.compas_races})"})
def compas_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """ProPublica COMPAS two-year recidivism, sensitive attribute race; see the module docstring."""
    folder, download = source_folder(params, raw_dir, "compas")
    (path,) = fetch_files(folder, COMPAS_FILES, "compas", download)
    verify_files([path], COMPAS_FILES, "compas", params.tabular)
    frame, y, a = clean_compas(read_compas(path), params.tabular.compas_races, str(path))
    return tabular_splits(frame, y, a, COMPAS_SPEC, params.tabular, seed, "compas")


DATASET_FILES.update(adult=ADULT_FILES, compas=COMPAS_FILES)


# --------------------------------------------------------------------------- shared encoding


def _numeric(values: pd.Series, column: str, where: str, source: str) -> pd.Series:
    """``values`` as numbers; the first that is not names its data row (the frame's index, counted from 1)."""
    converted = pd.to_numeric(values, errors="coerce")
    if converted.isna().any():
        bad, row = values[converted.isna()].iloc[0], values.index[converted.isna()][0]
        shown = "nothing (an empty field)" if pd.isna(bad) else repr(str(bad)[:40])
        raise DataSourceError(f"data.source={source}: {where}: data row {int(row) + 1:,}: column {column} holds "
                              f"{shown}; allowed: numbers")
    return converted


def one_hot(values: np.ndarray, column: str) -> tuple[np.ndarray, list[str]]:
    """float32 0/1 columns, one per distinct value (sorted), named ``column=value``."""
    vocabulary = sorted(set(values.tolist()))
    encoded = (values[:, None] == np.array(vocabulary, dtype=object)[None, :]).astype(np.float32)
    return encoded, [f"{column}={value}" for value in vocabulary]


def standardise(values: np.ndarray, train_index: np.ndarray) -> np.ndarray:
    """float32 ``(values - mean) / std`` with mean and std (ddof 0) of the rows ``train_index``; std 0 counts as 1."""
    train = values[train_index].astype(np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    std[std == 0] = 1.0
    return ((values.astype(np.float64) - mean) / std).astype(np.float32)


def encode_table(frame: pd.DataFrame, numeric: Sequence[str], categorical: Sequence[str],
                 train_index: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """float32 ``[N, F]``: the numerics standardised on ``train_index``, then the one-hot categoricals; names."""
    blocks = [standardise(frame[list(numeric)].to_numpy(np.float64), train_index)]
    names = list(numeric)
    for column in categorical:
        encoded, columns = one_hot(frame[column].astype(str).to_numpy(dtype=object), column)
        blocks.append(encoded)
        names += columns
    return np.ascontiguousarray(np.concatenate(blocks, axis=1), dtype=np.float32), tuple(names)


def tabular_splits(frame: pd.DataFrame, y: np.ndarray, a: np.ndarray, spec: TableSpec, params: TabularParams,
                   seed: int, source: str) -> RawSplits:
    """Random train/val/test rows (``params`` fractions, ``seed``), then features standardised on train."""
    index = random_split(len(frame), params.val_fraction, params.test_fraction, seed)
    if len(index["train"]) == 0:
        raise DataSourceError(f"data.source={source}: {len(frame)} rows after cleaning leave no training rows")
    categorical = [c for c in spec.categorical if params.keep_sensitive_feature or c != spec.sensitive]
    x, names = encode_table(frame, spec.numeric, categorical, index["train"])
    data = RawSplit(x, y, a, names)
    return {name: data.take(rows) for name, rows in index.items()}

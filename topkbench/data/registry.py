"""Dataset registry (``topkbench/conf/dataset/*.yaml``) and ``topkbench data list | info |
fetch | verify``.

Downloads go through pooch (checksum verification, progress bar).  Where the source publishes
no checksum (the LibSVM collection and Marlin's page do not), the registry says ``sha256: null``
and the first successful fetch records the file's hash in ``<dir>/SHA256SUMS`` ("trust on first
use"); ``verify`` then checks against that record and says which kind of check it made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from topkbench.config import DatasetConfig
from topkbench.data.files import cached_sha256, data_dir, resolve_path, sha256_of, unique_files
from topkbench.errors import ConfigError, DataFormatError, DatasetNotFoundError, TopkbenchError

LOCK_NAME = "SHA256SUMS"


class FetchError(TopkbenchError):
    """A download failed or a checksum did not match."""

    exit_code = 4

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def conf_dataset_dir(conf_dir: Path) -> Path:
    return conf_dir / "dataset"


def registry_names(conf_dir: Path) -> list[str]:
    return sorted(p.stem for p in conf_dataset_dir(conf_dir).glob("*.yaml"))


def registry_entry(conf_dir: Path, name: str) -> DatasetConfig:
    """The registry entry ``topkbench/conf/dataset/<name>.yaml`` as a DatasetConfig (plain
    YAML: the data layer never sees Hydra or OmegaConf)."""
    import yaml

    path = conf_dataset_dir(conf_dir) / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(
            f"unknown dataset {name!r}; registered: {', '.join(registry_names(conf_dir))}",
            hint="topkbench data list",
        )
    try:
        entry = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = None if mark is None else mark.line + 1
        raise DataFormatError(str(path), f"not valid YAML: {exc}", line) from None
    if not isinstance(entry, dict):
        raise DataFormatError(str(path), "a registry entry is a mapping of dataset options")
    return DatasetConfig.from_dict(entry)


@dataclass
class FileStatus:
    file: str
    path: Path
    url: str | None
    expected: str | None  # registry sha256 or the recorded one
    source: str  # "registry", "recorded", "none"
    state: str  # "ok", "missing", "mismatch", "unchecked", "downloaded", "recorded"
    actual: str | None = None


def _lock_path(cfg: DatasetConfig) -> Path:
    return data_dir() / cfg.name / LOCK_NAME


def _read_lock(cfg: DatasetConfig) -> dict[str, str]:
    p = _lock_path(cfg)
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2:
            out[parts[1].strip()] = parts[0]
    return out


def _write_lock(cfg: DatasetConfig, entries: dict[str, str]) -> None:
    p = _lock_path(cfg)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}  {f}\n" for f, h in sorted(entries.items())))
    tmp.replace(p)


def check_before_use(cfg: DatasetConfig) -> list[str]:
    """Refuse to train on a file that fails its checksum (registry or recorded on fetch);
    return the names of files that have no checksum to check against (said, not hidden)."""
    statuses = verify(cfg)
    bad = [s for s in statuses if s.state == "mismatch"]
    if bad:
        raise FetchError(
            "checksum mismatch for "
            + ", ".join(
                f"{s.path} (sha256 {s.actual}, expected {s.expected} from {s.source})" for s in bad
            ),  # fmt: skip
            hint=f"topkbench data verify {cfg.name}; restore the file or fetch it again",
        )
    return [s.file for s in statuses if s.state == "unchecked"]


def verify(cfg: DatasetConfig) -> list[FileStatus]:
    """Check every file of ``cfg`` against its registry or recorded sha256."""
    lock = _read_lock(cfg)
    out = []
    for f in unique_files(cfg):
        path = resolve_path(cfg, f["file"])
        expected, source = (f["sha256"], "registry") if f["sha256"] else (None, "none")
        if expected is None and f["file"] in lock:
            expected, source = lock[f["file"]], "recorded"
        st = FileStatus(f["file"], path, f["url"], expected, source, "missing")
        if path.exists():
            st.actual = cached_sha256(path)
            if expected is None:
                st.state = "unchecked"
            else:
                st.state = "ok" if st.actual == expected else "mismatch"
        out.append(st)
    return out


def manual_hint(cfg: DatasetConfig) -> str:
    target = data_dir() / cfg.name
    urls = [f["url"] for f in unique_files(cfg) if f["url"]]
    where = f"put the files by hand in {target}/ (or set $TOPKBENCH_DATA)"
    return where + (f"; sources: {', '.join(urls)}" if urls else "")


FETCH_DEADLINE = 3600.0  # seconds per file, start to finish
SOCKET_TIMEOUT = 30.0  # seconds without a byte


def deadline_downloader(deadline: float, progressbar: bool = False):
    """A pooch downloader that gives up after ``deadline`` seconds in total.

    A per-read socket timeout alone never fires on a server that trickles a byte at a time;
    reading with ``read1`` (at most one receive per call) lets the loop look at the clock
    after every receive.  A server that stalls sends nothing to look at the clock for: the
    socket's timeout is therefore set, before every receive, to the time the deadline leaves
    (at most :data:`SOCKET_TIMEOUT`), and a receive that times out ends the download.
    """
    import time
    import urllib.error
    import urllib.request

    def download(url, output_file, pooch_obj=None, check_only=False):  # pooch's protocol
        start = time.monotonic()

        def left() -> float:
            return deadline - (time.monotonic() - start)

        def expired() -> FetchError:
            return FetchError(
                f"{url}: download exceeded its deadline of {deadline:g} s",
                hint="a slow or stalled server; try again later, or raise --deadline",
            )

        req = urllib.request.Request(url, headers={"User-Agent": "topkbench"})
        try:
            with urllib.request.urlopen(req, timeout=min(SOCKET_TIMEOUT, deadline)) as resp:  # noqa: S310
                if check_only:
                    return True
                sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
                total = int(resp.headers.get("Content-Length") or 0) or None
                bar = None
                if progressbar:
                    from tqdm import tqdm

                    bar = tqdm(total=total, unit="B", unit_scale=True, leave=True)
                own = isinstance(output_file, (str, Path))
                fh = open(output_file, "wb") if own else output_file  # noqa: SIM115
                try:
                    while True:
                        if left() <= 0.0:
                            raise expired()
                        if sock is not None:
                            sock.settimeout(min(SOCKET_TIMEOUT, left()))
                        chunk = resp.read1(1 << 16)
                        if not chunk:
                            break
                        fh.write(chunk)
                        if bar is not None:
                            bar.update(len(chunk))
                finally:
                    if own:
                        fh.close()
                    if bar is not None:
                        bar.close()
        except (TimeoutError, urllib.error.URLError) as exc:
            if not isinstance(getattr(exc, "reason", exc), TimeoutError):
                raise
            if left() <= 0.0:
                raise expired() from None
            raise FetchError(
                f"{url}: the server sent nothing for {SOCKET_TIMEOUT:g} s",
                hint="a stalled server; try again later",
            ) from None

    return download


def fetch(
    cfg: DatasetConfig, progressbar: bool = True, deadline: float = FETCH_DEADLINE
) -> list[FileStatus]:
    """Download missing files of ``cfg`` with checksum verification; verify present ones.
    Each download must finish within ``deadline`` seconds."""
    import pooch

    statuses = verify(cfg)
    missing_url = [s.file for s in statuses if s.state == "missing" and not s.url]
    if missing_url:
        raise DatasetNotFoundError(
            cfg.name,
            [str(s.path) for s in statuses if s.state == "missing"],
            hint=f"{cfg.name} has no public download; {manual_hint(cfg)}",
        )
    bad = [s for s in statuses if s.state == "mismatch"]
    if bad:
        raise FetchError(
            "checksum mismatch for "
            + ", ".join(
                f"{s.path} (sha256 {s.actual}, expected {s.expected} from {s.source})" for s in bad
            ),
            hint=f"delete the file and fetch again, or {manual_hint(cfg)}",
        )
    lock = _read_lock(cfg)
    for st in statuses:
        if st.state != "missing":
            continue
        st.path.parent.mkdir(parents=True, exist_ok=True)
        known = f"sha256:{st.expected}" if st.expected else None
        try:
            pooch.retrieve(
                st.url,
                known_hash=known,
                fname=st.path.name,
                path=st.path.parent,
                downloader=deadline_downloader(deadline, progressbar),
            )
        except FetchError:
            raise
        except ValueError as exc:  # pooch: hash mismatch (the download is discarded)
            raise FetchError(
                f"downloaded {st.url} but its checksum is wrong: {exc}",
                hint=manual_hint(cfg),
            ) from None
        except Exception as exc:  # network errors come from requests / urllib3
            raise FetchError(
                f"could not download {st.url}: {type(exc).__name__}: {exc}",
                hint=f"offline? {manual_hint(cfg)}",
            ) from None
        st.actual = sha256_of(st.path)
        st.state = "downloaded"
        if st.expected is None:
            lock[st.file] = st.actual
            st.expected, st.source, st.state = st.actual, "recorded", "recorded"
    for st in statuses:
        if st.state == "unchecked":  # placed by hand, no published hash: record it too
            lock[st.file] = st.actual
            st.expected, st.source, st.state = st.actual, "recorded", "recorded"
    if any(st.state == "recorded" for st in statuses):
        _write_lock(cfg, lock)
    return statuses

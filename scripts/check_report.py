"""Render reports/report.html in headless Chromium and write a screenshot (layout check, broken images).

It stands apart from the package and its CLI: it drives a browser that neither the install nor the pipeline needs.

Usage: python scripts/check_report.py [report.html] [--out screenshot.png] [--chromium /usr/bin/chromium]
Exit 0 when the screenshot was written and is non-trivial; 2 when Chromium is missing or failed.
Chromium runs offline-minded: fresh profile, no background networking, sync, updates or QUIC.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome")
MIN_SCREENSHOT_BYTES = 20_000  # a blank 1280x4000 PNG compresses to a few kB


def find_chromium(explicit: str | None = None) -> str | None:
    """The Chromium binary: ``explicit``, else ``$CHROMIUM``, else the first candidate on disk or PATH."""
    for candidate in (explicit, os.environ.get("CHROMIUM"), *CHROMIUM_CANDIDATES):
        if candidate and (Path(candidate).is_file() or shutil.which(candidate)):
            return shutil.which(candidate) or candidate
    return None


def chromium_command(chromium: str, html: Path, screenshot: Path, profile: Path, size: str = "1280,4000") -> list[str]:
    """The headless screenshot command line for ``html``."""
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={screenshot}",
            f"--window-size={size}", html.resolve().as_uri()]


def screenshot(html: Path, out: Path, chromium: str, timeout_s: float = 60.0, size: str = "1280,4000") -> Path:
    """Render ``html`` to the PNG ``out``; raise RuntimeError with Chromium's output when it fails."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        done = subprocess.run(chromium_command(chromium, html, out.resolve(), Path(profile), size),
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    if not out.exists():
        raise RuntimeError(f"chromium wrote no screenshot (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return out


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", nargs="?", default="reports/report.html", type=Path)
    parser.add_argument("--out", default=Path("reports/report_screenshot.png"), type=Path)
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--window-size", default="1280,4000")
    args = parser.parse_args(argv)
    if not args.html.exists():
        print(f"{args.html} not found: build the report first (python pipeline/report.py)", file=sys.stderr)
        return 2
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("chromium not found: apt-get install -y chromium (or pass --chromium)", file=sys.stderr)
        return 2
    try:
        shot = screenshot(args.html, args.out, chromium, size=args.window_size)
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        print(f"screenshot failed: {exc}", file=sys.stderr)
        return 2
    size = shot.stat().st_size
    if not is_png(shot) or size < MIN_SCREENSHOT_BYTES:
        print(f"{shot}: {size} bytes, looks blank or broken", file=sys.stderr)
        return 2
    print(f"wrote {shot} ({size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Render a simulation's report.html to a PNG with headless Chromium.

    hivemesh sim examples/scenario-choco.toml --out sim-report
    python examples/render_report.py sim-report --png report.png

report.html needs no browser to be written, and none to be read on any machine that has one:
this script is for a screenshot (a CI artifact, an issue, a slide). It runs the Chromium of
your distribution (Debian/Ubuntu: ``apt-get install chromium``); it downloads nothing. The
page is self-contained, so Chromium fetches nothing either.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 120.0  # a cold start of Chromium in a small container takes a few seconds; a hang is not one


def find_browser(requested: str | None) -> str:
    """The browser's path, or SystemExit(2) with what to install."""
    names = (requested,) if requested else BROWSERS
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    raise SystemExit(f"render_report: no {' or '.join(names)} on PATH. Install your distribution's "
                     "Chromium (Debian/Ubuntu: apt-get install chromium) or pass --browser PATH; "
                     "report.html itself opens in any browser without this script.")


def render(page: Path, png: Path, *, browser: str, width_px: int, height_px: int) -> None:
    """Screenshot the top ``width_px`` x ``height_px`` of ``page`` into ``png``."""
    png = png.resolve()
    png.unlink(missing_ok=True)  # a stale screenshot must not pass for a new one
    with tempfile.TemporaryDirectory(prefix="hivemesh-chromium-") as profile:
        command = [browser, "--headless", "--disable-gpu", "--hide-scrollbars",
                   f"--user-data-dir={profile}", f"--window-size={width_px},{height_px}",
                   f"--screenshot={png}", page.resolve().as_uri()]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Chromium refuses to start its sandbox as root (containers, CI): the page is our own file.
            command.insert(1, "--no-sandbox")
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"render_report: {browser} did not finish in {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0 or not png.exists():
        raise SystemExit(f"render_report: {browser} exited {done.returncode} without writing {png}:\n"
                         f"{done.stderr.strip()[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("report", type=Path, help="report.html, or the folder 'hivemesh sim --out' wrote")
    parser.add_argument("--png", type=Path, default=None,
                        help="screenshot to write (default: next to the page)")
    parser.add_argument("--browser", default=None, help="Chromium's name or path (default: the first of "
                                                        f"{', '.join(BROWSERS)} on PATH)")
    parser.add_argument("--width", type=int, default=1280, help="window width in pixels (default: 1280)")
    parser.add_argument("--height", type=int, default=2400,
                        help="window height in pixels: the screenshot shows this much of the page "
                             "(default: 2400)")
    args = parser.parse_args(argv)
    page = args.report / "report.html" if args.report.is_dir() else args.report
    if not page.is_file():
        raise SystemExit(f"render_report: no such page: {page} (run 'hivemesh sim ... --out DIR' first)")
    browser = find_browser(args.browser)
    png = args.png or page.with_suffix(".png")
    render(page, png, browser=browser, width_px=args.width, height_px=args.height)
    print(f"screenshot of {page} written to {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The HTML page ``dvc plots show`` / ``dvc plots diff`` fill, with Vega inline so it renders offline.

DVC's default page loads vega, vega-lite and vega-embed from a CDN and is blank without network.
DVC lets a repository supply its own page (``plots.html_template`` in ``.dvc/config``, or
``--html-template``): DVC replaces ``{plot_divs}`` with one ``<div>`` per plot whose inline script
calls ``vegaEmbed``; a page without ``{scripts}`` gets none of DVC's CDN ``<script src>`` tags.
This module writes such a page with the three libraries inline, bundled by the ``vl-convert-python``
package (``vl_convert.javascript_bundle``, which Altair uses for its offline HTML): nothing is fetched
when the bundle is made or when the page is opened.

The page is about 0.9 MB of generated JavaScript, so it is not committed: the report stage writes it
(:data:`PLOTS_TEMPLATE`, a DVC output, restored by ``dvc checkout``/``dvc pull`` like any other), and
``debias plots-template`` writes it in a workspace that has none (e.g. a fresh clone that only pulled
experiments). Making the bundle takes about 2 s, so it is kept in the user's cache
(``~/.cache/debias/vega/``, keyed by the package and Vega-Lite versions): each experiment's report
stage then copies it in milliseconds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from debias.core.io import atomic_path

PLOTS_TEMPLATE = Path("reports/plots_template.html")
# DVC's templates (built-in and .dvc/plots/) declare the Vega-Lite v5 schema: bundle the newest v5.
VEGA_LITE_VERSION = "5.21"
# The default bundle snippet ends by publishing these; a page whose bundle lacks one cannot draw.
GLOBALS = ("window.vegaEmbed", "window.vegaLite", "window.vega")
# The placeholders DVC's HTML class replaces; ``{scripts}`` is left out on purpose (it is the CDN tags).
PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")

PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
{refresh_tag}
<title>DVC plots</title>
<!-- vega {vega}, vega-lite {vega_lite}, vega-embed {vega_embed}: bundled by vl-convert-python {vl_convert} -->
<script>
(function () {{
{bundle}
}})();
</script>
<style>
body {{ font: 13px system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1em; }}
body > div {{ display: inline-block; vertical-align: top; margin: 0 1.5em 1.5em 0; }}
</style>
</head>
<body>
{plot_divs}
</body>
</html>
"""


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "debias" / "vega"


def _valid(bundle: str) -> bool:
    return all(name in bundle for name in GLOBALS) and not any(p in bundle for p in PLACEHOLDERS)


def javascript_bundle() -> tuple[str, dict[str, str]]:
    """vega, vega-lite and vega-embed as one classic script that sets ``window.vegaEmbed`` etc., and their versions."""
    from importlib.metadata import version

    import vl_convert

    versions = {"vega": vl_convert.get_vega_version(), "vega_lite": VEGA_LITE_VERSION,
                "vega_embed": vl_convert.get_vega_embed_version(), "vl_convert": version("vl-convert-python")}
    cached = cache_dir() / f"vl-convert-{versions['vl_convert']}-vega-lite-{VEGA_LITE_VERSION}.js"
    try:
        bundle = cached.read_text(encoding="utf-8")
        if _valid(bundle):
            return bundle, versions
    except OSError:
        pass
    bundle = vl_convert.javascript_bundle(vl_version=VEGA_LITE_VERSION)
    if not _valid(bundle):
        raise RuntimeError(f"vl_convert.javascript_bundle() gave a bundle without {', '.join(GLOBALS)} "
                           f"or with one of DVC's placeholders {', '.join(PLACEHOLDERS)}")
    try:
        with atomic_path(cached) as tmp:
            tmp.write_text(bundle, encoding="utf-8")
    except OSError:
        pass  # a read-only home only costs the 2 s next time
    return bundle, versions


def render_page(bundle: str, versions: dict[str, str]) -> str:
    """DVC's HTML template: ``{plot_divs}`` (and ``{refresh_tag}``) left for DVC, the bundle inline."""
    # "</script" inside the bundle would end the <script> element early; "<\\/" means the same in JS.
    inline = re.sub(r"</(script)", r"<\\/\1", bundle, flags=re.IGNORECASE)
    return PAGE.format(bundle=inline, plot_divs="{plot_divs}", refresh_tag="{refresh_tag}", **versions)


def write_plots_template(path: str | Path = PLOTS_TEMPLATE) -> Path:
    """Write the offline page to ``path`` (atomically) and return it. An existing file is replaced only when it is a
    plots template (it holds DVC's ``{plot_divs}`` placeholder): a ValueError names any other file, or a folder."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; allowed: the path of an .html file")
    if path.exists() and "{plot_divs}" not in path.read_text(encoding="utf-8", errors="replace"):
        raise ValueError(f"{path} exists and is not a plots template (it lacks DVC's {{plot_divs}} placeholder); it is "
                         "left as it is: choose another path")
    page = render_page(*javascript_bundle())
    with atomic_path(path) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return path

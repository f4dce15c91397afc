"""Publish the committed asv history (``benchmarks/results/``) as static HTML.

``asv publish`` over the results of every machine profile, with the commits ordered by
this checkout's history (the branch checked out), into a folder (default
``benchmarks/html``)::

    python benchmarks/asv_publish.py [OUTDIR]

The documentation build calls it (``docs/conf.py``) and ships the pages with the site as
``asv/index.html``: the graphs of every benchmark over the commits, per machine, with the
parameters as series. The pages are self-contained: the scripts and styles that asv's
pages load from CDNs are copied beside them from ``benchmarks/asv_vendor/`` and the pages
point at those copies, so that nothing is fetched from the network. The results are
JSON files beside the pages, which a browser reads when the site is served over HTTP
(``python -m http.server`` in the site's folder); some browsers refuse them to a page
opened from ``file://``. Needs asv and a git checkout with the recorded commits.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "benchmarks" / "asv_vendor"

#: CDN addresses in asv's pages -> the local copies of benchmarks/asv_vendor/
LOCAL = {
    r"https://code\.jquery\.com/jquery-3\.3\.1\.min\.js": "jquery-3.3.1.min.js",
    r"https://[^\"']*/flot/0\.8\.3/jquery\.flot\.min\.js": "jquery.flot-0.8.3.min.js",
    r"https://[^\"']*/flot/0\.8\.3/jquery\.flot\.(time|selection|categories)\.min\.js":
        r"jquery.flot-0.8.3.\1.min.js",
    r"https://[^\"']*/jquery\.flot\.orderBars\.js": "jquery.flot.orderBars.js",
    r"https://[^\"']*/stupidtable\.min\.js": "stupidtable.js",
    r"https://[^\"']*/md5\.min\.js": "md5.js",
    r"https://[^\"']*/bootstrap\.min\.(js|css)": r"bootstrap-3.1.0.min.\1",
}


def localize(html_dir: Path) -> list[str]:
    """Point asv's pages at the copies in ``vendor/`` (copied there); returns the
    addresses of scripts and styles still loaded from elsewhere (none expected)."""
    html_dir = Path(html_dir)
    shutil.copytree(VENDOR, html_dir / "vendor", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("*.md"))
    left = []
    for page in html_dir.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        for pattern, local in LOCAL.items():
            text = re.sub(pattern, lambda m, t=local: "vendor/" + m.expand(t), text)
        left += re.findall(r"<(?:script|link)[^>]*(?:src|href)=\"(https?://[^\"]+)\"", text)
        page.write_text(text, encoding="utf-8")
    return left


def publish(out_dir: Path) -> int:
    """Run ``asv publish`` into ``out_dir`` and make its pages offline (:func:`localize`);
    returns asv's exit status (1 when a page would still load a script or style from the
    network)."""
    from asv.util import load_json

    conf = load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    with tempfile.TemporaryDirectory(prefix="asv-publish-") as tmp:
        conf.update(
            repo=str(ROOT),
            branches=["HEAD"],
            benchmark_dir=str(ROOT / "benchmarks" / "benchmarks"),
            results_dir=str(ROOT / "benchmarks" / "results"),
            html_dir=str(Path(out_dir).resolve()),
            env_dir=str(Path(tmp) / "env"),
        )
        conf_path = Path(tmp) / "asv.conf.json"
        conf_path.write_text(json.dumps(conf, indent=2))
        env = dict(os.environ, HOME=tmp)
        status = subprocess.run(
            [sys.executable, "-m", "asv", "publish", "--config", str(conf_path)], env=env
        ).returncode
    if status == 0:
        left = localize(out_dir)
        if left:
            print(f"loaded from the network still: {left}", file=sys.stderr)
            return 1
    return status


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "benchmarks" / "html"
    sys.exit(publish(target))

"""Regenerate the tutorial's pictures (``docs/img/tutorial_*.png``) and those of "Reject unknown queries"
(``docs/img/reject_*.png``) from a real run of the tutorial's commands.

Run from a checkout's root::

    python docs/hooks/make_screenshots.py                       # the tutorial's sizes; rewrites docs/img/
    python docs/hooks/make_screenshots.py --quick --out DIR     # a short run into DIR (what the docs tests run)

Steps, as docs/tutorial.md: write the toy ``photos/`` folder and the ``queries/``, train HAPPIER on it, search the
queries, fit HEAT and the baselines against two noise sets. Then, as docs/reject-unknown.md: store the guard of
fit_heat's table that rejects uniform noise on this toy model (``--guard Mahalanobis``; HEAT accepts most of it
here) in ``runs/photos/final/ood/``, search again with the guarded model (three queries and a noise picture, so
each query gets a verdict), serve the Gradio demo and upload the noise picture in the browser. The figures the
recipes wrote are copied as they are (training curves, precision-recall, embedding map, OOD histograms); the pages
(the model card, rendered from its markdown, the two search pages and the demo) are screenshotted with headless
Chromium (``chromium`` on the PATH, or ``--chromium``; the demo also needs ``chromedriver``, Selenium and Gradio).
What cannot be screenshotted is skipped with a message and the command exits 3.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
#: picture name in docs/img (without the ``tutorial_`` prefix) -> file the run writes (relative to the work folder)
FIGURES = {
    "training_curves": "runs/photos/final/training_curves.png",
    "precision_recall": "runs/photos/final/hierarchical_precision_recall.png",
    "embedding_map": "runs/photos/final/embedding_map.png",
    "ood_histograms": "runs/heat/score_histograms.png",
}
PAGES = {"model_card": "runs/photos/final/README.md", "search": "runs/search/results.html"}
#: the pages of docs/reject-unknown.md (names in docs/img)
REJECT = ("reject_search_verdicts.png", "reject_demo.png")


def write_photos(work: Path, per_class: int) -> None:
    """The tutorial's step 1: ``photos/<shape>/<variant>-<colour>/*.jpg`` and six ``queries/*.jpg``."""
    import numpy as np
    from PIL import Image

    from pml_suprank.data import SyntheticShapes

    shapes = SyntheticShapes("all", num_per_class=per_class, image_size=64)
    for i in range(len(shapes)):
        family, variant, colour = shapes.fine_class_name(int(shapes.labels[i, 0])).split("/")
        folder = work / "photos" / family / f"{variant}-{colour}"
        folder.mkdir(parents=True, exist_ok=True)
        shapes.get_image(i).save(folder / f"{i:04d}.jpg")
    new = SyntheticShapes("all", num_per_class=1, image_size=64, seed=1)
    (work / "queries").mkdir(exist_ok=True)
    for i in range(0, len(new), 9):
        new.get_image(i).save(work / "queries" / f"new_{i:02d}.jpg")
    # docs/reject-unknown.md: three of the queries and a picture of noise, none of the photos' kind
    (work / "mixed").mkdir(exist_ok=True)
    for query in sorted((work / "queries").glob("*.jpg"))[:3]:
        shutil.copyfile(query, work / "mixed" / query.name)
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(work / "mixed" / "noise.png")


def run_recipes(work: Path, quick: bool) -> None:
    """The tutorial's steps 2, 5 and 6 (the commands as written; ``quick`` shortens them), then, as
    docs/reject-unknown.md: the model's guard fitted with ``--guard Mahalanobis`` and the guarded search of ``mixed/``
    (three queries and a noise picture)."""
    train = ["--dataset", "photos", "--output_dir", "runs/photos", "--epochs", "4" if quick else "50"]
    search = ["--model", "runs/photos/final", "--gallery", "photos", "--queries", "queries", "--k", "8",
              "--output_dir", "runs/search"]  # fmt: skip
    heat = ["--model", "runs/photos/final", "--id_dataset", "photos", "--ood_datasets", "noise-uniform",
            "noise-blobs", "--heat_epochs", "2" if quick else "30", "--heat_batch_size", "32", "--output_dir",
            "runs/heat"]  # fmt: skip
    # the guard of the pictures: the detector of fit_heat's table that accepts no uniform noise on this toy model
    guard = ["--model", "runs/photos/final", "--id_dataset", "photos", "--ood_datasets", "noise-uniform",
             "noise-blobs", "--guard", "Mahalanobis", "--detectors", "Mahalanobis",
             "--output_dir", "runs/guard"]  # fmt: skip
    if quick:
        heat += ["--train_epochs", "1"]
        guard += ["--train_epochs", "1"]
    guarded = ["--model", "runs/photos/final", "--gallery", "photos", "--queries", "mixed", "--k", "6",
               "--output_dir", "runs/search_guarded"]  # fmt: skip
    steps = (("train_happier", train), ("search", search), ("fit_heat", heat), ("fit_heat", guard), ("search", guarded))
    for recipe, args in steps:
        cmd = [sys.executable, "-m", f"pml_suprank.recipes.{recipe}", *args]
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"error: {' '.join(cmd[2:])} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    if not (work / "runs/photos/final/ood/guard.json").is_file():
        raise SystemExit("error: fit_heat --model runs/photos/final stored no guard in runs/photos/final/ood/")


_CSS = """body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:900px;margin:24px auto;
color:#1f2328;font-size:14px;line-height:1.5}table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #d0d7de;
padding:4px 10px}th{background:#f6f8fa}pre{background:#f6f8fa;padding:10px;overflow:auto;font-size:12px}
code{background:#f6f8fa;padding:1px 4px;border-radius:4px}h1{border-bottom:1px solid #d0d7de}img{max-width:100%}
blockquote{border-left:4px solid #d0d7de;margin:0;padding:0 12px;color:#59636e}"""


def _inline(text: str) -> str:
    """Inline markdown of a card line: escapes, code, bold, links and images (the subset the card writer uses)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{html.escape(part[1:-1], quote=False)}</code>")
            continue
        part = re.sub(r"\\([\\`*_\[\]|])", lambda m: f"&#{ord(m.group(1))};", part)
        part = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", r'<img alt="\1" src="\2">', part)
        part = re.sub(r"\[([^\]]+)\]\(([^)]+)\)", r'<a href="\2">\1</a>', part)
        part = re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", part)
        out.append(part)
    return "".join(out)


def card_html(markdown_text: str) -> str:
    """The card as an HTML page, the way the Hub shows it (the YAML front matter left out)."""
    text = re.sub(r"\A---\n.*?\n---\n", "", markdown_text, flags=re.S)
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1 : j]), quote=False) + "</pre>")
            i = j + 1
            continue
        if line.startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            rows = [re.split(r"(?<!\\)\|", r.strip()[1:-1]) for r in lines[i:j]]
            head = "".join(f"<th>{_inline(c.strip())}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{_inline(c.strip())}</td>" for c in r) + "</tr>" for r in rows[2:])
            out.append(f"<table><tr>{head}</tr>{body}</table>")
            i = j
            continue
        heading = re.match(r"^(#{1,3}) (.*)", line)
        if heading:
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif line.startswith("- "):
            out.append(f"<ul><li>{_inline(line[2:])}</li></ul>")
        elif line.startswith("> "):
            out.append(f"<blockquote>{_inline(line[2:])}</blockquote>")
        elif line.startswith("<details") or line.startswith("</details"):
            out.append(line)
        elif line.strip():
            out.append(f"<p>{_inline(line)}</p>")
        i += 1
    head = f"<!doctype html><html><head><meta charset='utf-8'><style>{_CSS}</style></head>"
    return f"{head}<body>{''.join(out)}</body></html>"


def screenshot(chromium: str, page: Path, png: Path, width: int = 1100, height: int = 1400) -> None:
    """A PNG of the HTML file ``page`` rendered by headless Chromium (the top ``height`` pixels)."""
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", f"--screenshot={png}",
           f"--window-size={width},{height}", page.resolve().as_uri()]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not png.is_file():
        raise SystemExit(f"error: chromium could not screenshot {page}: {proc.stderr[-2000:]}")


def demo_tools() -> str | None:
    """``None`` when the demo can be screenshotted (chromedriver, Selenium, Gradio), else what is missing."""
    missing = [name for name in ("selenium", "gradio") if importlib.util.find_spec(name) is None]
    if shutil.which("chromedriver") is None:
        missing.append("chromedriver")
    return ", ".join(missing) or None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def screenshot_demo(chromium: str, work: Path, png: Path, query: Path, width: int = 1280) -> None:
    """Serve the demo (``python -m pml_suprank.recipes.demo --model runs/photos/final --gallery photos``), upload
    ``query`` in headless Chromium (Selenium), wait for the verdict and the neighbours, and save the whole page as
    ``png``. Every wait is bounded; the server is stopped afterwards."""
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    port = _free_port()
    url = f"http://127.0.0.1:{port}/"
    cmd = [sys.executable, "-m", "pml_suprank.recipes.demo", "--model", "runs/photos/final", "--gallery", "photos",
           "--k", "8", "--port", str(port)]  # fmt: skip
    server = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    driver = None
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise SystemExit(f"error: the demo exited ({server.returncode}):\n{server.stdout.read()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 - the local demo
                    if reply.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"error: the demo did not answer on {url} within 300 s")
            time.sleep(1)
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--hide-scrollbars", f"--window-size={width},1000"):  # fmt: skip
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(shutil.which("chromedriver")))
        driver.set_page_load_timeout(120)
        driver.get(url)
        wait = WebDriverWait(driver, 120)
        upload = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#query input[type=file]")))
        upload.send_keys(str(query.resolve()))
        wait.until(lambda d: "kind" in (d.find_element(By.CSS_SELECTOR, "#verdict textarea").get_attribute("value")
                                         or ""))  # fmt: skip
        wait.until(lambda d: ".jpg" in d.find_element(By.ID, "table").text)
        wait.until(lambda d: d.execute_script(
            "const im = [...document.querySelectorAll('#neighbours img')];"
            "return im.length > 0 && im.every(i => i.complete && i.naturalWidth > 0);"))  # fmt: skip
        height = 0
        for _ in range(4):  # the whole page in one picture: grow the viewport until the page's height is stable
            now = int(driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]["height"])
            if now == height:
                break
            height = min(now, 4000)
            size = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
            driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", size)
            time.sleep(1)  # the page re-lays out at the new size
        if not driver.save_screenshot(str(png)):
            raise SystemExit(f"error: could not screenshot the demo into {png}")
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=IMG, help="folder of the pictures (default docs/img)")
    parser.add_argument("--quick", action="store_true", help="a short run (the docs tests)")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: tutorial/ in a temporary one)")
    parser.add_argument("--chromium", default=None, help="the Chromium executable (default: chromium on the PATH)")
    args = parser.parse_args(argv)
    chromium = args.chromium or shutil.which("chromium") or shutil.which("chromium-browser")
    with tempfile.TemporaryDirectory(prefix="pml_suprank_screenshots_") as tmp:
        work = args.work or Path(tmp) / "tutorial"  # the folder name shows on the search page
        work.mkdir(parents=True, exist_ok=True)
        write_photos(work, per_class=5)
        run_recipes(work, args.quick)
        args.out.mkdir(parents=True, exist_ok=True)
        for name, rel in FIGURES.items():
            shutil.copyfile(work / rel, args.out / f"tutorial_{name}.png")
        if chromium is None:
            print("chromium not found: the model card, search pages and demo screenshots were not regenerated")  # noqa: T201
            return 3
        card = work / "runs/photos/final/card.html"
        card.write_text(card_html((work / PAGES["model_card"]).read_text()), encoding="utf-8")
        screenshot(chromium, card, args.out / "tutorial_model_card.png", height=1500)
        screenshot(chromium, work / PAGES["search"], args.out / "tutorial_search.png", width=1300, height=1000)
        screenshot(chromium, work / "runs/search_guarded/results.html", args.out / REJECT[0], height=1000)
        missing = demo_tools()
        if missing is not None:
            print(f"{missing} not found: the demo screenshot was not regenerated")  # noqa: T201
            return 3
        screenshot_demo(chromium, work, args.out / REJECT[1], work / "mixed" / "noise.png")
    print(f"wrote {len(FIGURES) + 2 + len(REJECT)} pictures into {args.out}")  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The Gradio demo end to end, a query image in and the guard's verdict and the neighbours' names out: through its
HTTP API with ``gradio_client`` and in headless Chromium (both in the full suite); its refusals in the quick tier."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

gr = pytest.importorskip("gradio", reason="the demo extra (gradio) is not installed")
gradio_client = pytest.importorskip("gradio_client")

from pml_suprank.models import RetrievalModel  # noqa: E402
from pml_suprank.ood import KNN  # noqa: E402
from pml_suprank.ood.guard import OODGuard  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A guarded tiny model, a gallery of two colour classes, a noise query and a known query; the demo served."""
    root = tmp_path_factory.mktemp("demo")
    rng = np.random.default_rng(0)

    def png(path, colour):
        path.parent.mkdir(parents=True, exist_ok=True)
        arr = np.clip(np.asarray(colour) + rng.random((64, 64, 3)) * 40, 0, 255).astype(np.uint8)
        Image.fromarray(arr).save(path)

    for name, colour in (("red", (200, 20, 20)), ("green", (20, 200, 20))):
        for i in range(6):
            png(root / "gallery" / name / f"{name}{i}.png", colour)
    png(root / "known.png", (200, 20, 20))
    Image.fromarray((rng.random((64, 64, 3)) * 255).astype(np.uint8)).save(root / "noise.png")
    torch.manual_seed(0)
    RetrievalModel("test_resnet", embedding_size=8, image_size=64).save_pretrained(root / "final")
    model = RetrievalModel.from_pretrained(root / "final")
    from pml_suprank import data

    transform = data.build_transforms(model.data_config, train=False)  # the demo's own preprocessing
    pictures = [np.clip(np.asarray(c) + rng.random((64, 64, 3)) * 40, 0, 255).astype(np.uint8)
                for c in [(200, 20, 20), (20, 200, 20)] * 16]  # fmt: skip
    x = torch.stack([transform(Image.fromarray(p)) for p in pictures])
    labels = torch.arange(32) % 2
    OODGuard.fit(model, [{"image": x, "labels": labels}], [{"image": x}], detector=KNN(k=5)).save(root / "final")
    demo = pytest.importorskip("pml_suprank.recipes.demo")
    port = _free_port()
    app = demo.main(["--model", str(root / "final"), "--gallery", str(root / "gallery"), "--k", "3", "--port",
                     str(port)], block=False)  # fmt: skip
    yield root, f"http://127.0.0.1:{port}/"
    app.close()


@pytest.mark.slow
def test_demo_http_api_gives_neighbours_and_verdict(served):
    root, url = served
    client = gradio_client.Client(url, verbose=False)
    verdict, gallery, table = client.predict(gradio_client.handle_file(str(root / "noise.png")), api_name="/search")
    assert verdict.startswith("OOD: unknown kind")
    assert len(gallery) == 3 and len(table["data"]) == 3
    names = [row[1] for row in table["data"]]
    assert all(n.startswith(("red/", "green/")) for n in names)
    assert [row[2] for row in table["data"]] == [n.split("/")[0] for n in names]  # the class is the folder
    verdict, _, table = client.predict(gradio_client.handle_file(str(root / "known.png")), api_name="/search")
    assert verdict.startswith("known kind")
    assert table["data"][0][1].startswith("red/")  # a red query: a red neighbour first


def test_demo_refuses_bad_inputs_in_one_line(tmp_path, capsys):
    demo = pytest.importorskip("pml_suprank.recipes.demo")
    with pytest.raises(SystemExit) as raised:
        demo.main(["--model", str(tmp_path / "missing"), "--gallery", str(tmp_path)], block=False)
    err = capsys.readouterr().err.strip()
    assert raised.value.code == 2 and len(err.splitlines()) == 1 and f"error: --model {tmp_path / 'missing'}: " in err


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_demo_refuses_a_port_out_of_range_before_loading(port, tmp_path, capsys, monkeypatch):
    """A port no socket can bind: one ``error:`` line naming ``--port``, before the model is loaded (a traceback from
    the server's bind once the gallery was embedded, before)."""
    demo = pytest.importorskip("pml_suprank.recipes.demo")
    monkeypatch.setattr(demo.DemoSearch, "load", lambda *a, **k: pytest.fail("loaded before --port was checked"))
    with pytest.raises(SystemExit) as raised:
        demo.main(["--model", str(tmp_path), "--gallery", str(tmp_path), "--port", port], block=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert raised.value.code == 2 and err[-1].endswith(f"error: --port: expected a TCP port, an int in [1, 65535]; "
                                                       f"got {port}")  # fmt: skip


@pytest.mark.slow
def test_demo_in_headless_chromium(served):
    """Upload an image in a real browser, read the verdict and the neighbours' names from the page."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        pytest.skip("headless Chromium and chromedriver are not installed (CI installs chromium chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    root, url = served
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1200,1000"):  # fmt: skip
        options.add_argument(flag)
    service = webdriver.ChromeService(executable_path=CHROMEDRIVER)
    driver = webdriver.Chrome(options=options, service=service)
    try:
        driver.get(url)
        wait = WebDriverWait(driver, 60)
        upload = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "#query input[type=file]")))
        upload.send_keys(str(root / "noise.png"))
        wait.until(lambda d: "unknown kind" in (d.find_element(By.CSS_SELECTOR, "#verdict textarea")
                                                 .get_attribute("value") or ""))  # fmt: skip
        wait.until(lambda d: ("red/" in d.find_element(By.ID, "table").text
                              or "green/" in d.find_element(By.ID, "table").text))  # fmt: skip
        text = driver.find_element(By.ID, "table").text
        assert sum(name in text for name in [f"{c}/{c}{i}.png" for c in ("red", "green") for i in range(6)]) == 3
        shot = Path(root / "demo.png")
        driver.save_screenshot(str(shot))
        assert shot.stat().st_size > 0
    finally:
        driver.quit()

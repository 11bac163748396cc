"""``pml-suprank-demo --model RUN/final|org/name --gallery my_photos/ [--k 8] [--port 7860]``: a Gradio page where a
person drops a query image and sees its nearest gallery images and the OOD guard's verdict.

Needs the ``demo`` extra (``pip install "pml-suprank[demo]"``); offline (no share link, no analytics). ``--gallery``: a
folder of images, flat or one sub-folder per class (the class shown is a file's first folder). A guarded model (ood/
from ``fit_heat --model``) says "OOD: unknown kind" or "known kind" (score > threshold = OOD); without a guard the
page says the query is not checked. As a Hugging Face Space: this file as ``app.py`` beside a requirements.txt holding
``pml-suprank[demo]`` and the gallery; without flags it reads PML_SUPRANK_MODEL / PML_SUPRANK_GALLERY and listens on
0.0.0.0 when SPACE_ID is set.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # noqa: TID251 - offline: no usage reports
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # noqa: TID251 - recipes may configure the process

import argparse  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

__all__ = ["DemoSearch", "build_app", "build_parser", "main", "run"]


@dataclass
class DemoSearch:
    """The demo's engine (no Gradio here): a model, its index over the gallery folder, and :meth:`query`."""

    model: Any
    gallery: Any  # pml_suprank.search.image_files.ImageFiles
    index: Any  # pml_suprank.search.RetrievalIndex
    transform: Any
    k: int = 8

    @classmethod
    def load(cls, model: str, gallery: str, k: int = 8, batch_size: int = 64) -> DemoSearch:
        """Load the model (folder or Hub id) and embed every image of the ``gallery`` folder once."""
        from pml_suprank import data
        from pml_suprank.models import RetrievalModel
        from pml_suprank.search.image_files import ImageFiles

        try:
            net = RetrievalModel.from_pretrained(model).eval()
        except (OSError, ValueError, TypeError) as e:  # the message names the flag, as the gallery's does
            raise ValueError(f"--model {model}: {e}") from e
        transform = data.build_transforms(net.data_config, train=False)
        images = ImageFiles(gallery, transform, what=f"--gallery {gallery}")
        loader = torch.utils.data.DataLoader(images, batch_size=batch_size, collate_fn=data.collate)
        index = net.build_index(loader, ids=list(images.names))
        return cls(net, images, index, transform, k)

    def class_of(self, i: int) -> str:
        """The class of gallery image ``i``: its first folder (``cat/x.png`` → ``cat``), ``-`` in a flat folder."""
        parts = self.gallery.names[i].split("/")
        return parts[0] if len(parts) > 1 else "-"

    @torch.no_grad()
    def query(self, image: Any) -> dict[str, Any]:
        """``{"verdict": str, "ood": {"score", "is_ood"} | None, "neighbours": [{"rank", "name", "class", "score",
        "index"}, ...]}`` for a PIL query image."""
        x = self.transform(image.convert("RGB"))[None]
        scores, indices = self.index.search(self.model(x), min(self.k, len(self.index)))
        neighbours = [{"rank": r + 1, "name": self.gallery.names[j], "class": self.class_of(j), "score": float(s),
                       "index": int(j)} for r, (s, j) in enumerate(zip(scores[0].tolist(), indices[0].tolist()))
                      if j >= 0]  # fmt: skip
        guard = self.model.ood_guard
        if guard is None:
            return {"verdict": "not checked: this model has no OOD guard", "ood": None, "neighbours": neighbours}
        ood = guard.predict(self.model, x).records()[0]
        verdict = (f"OOD: unknown kind (score {ood['score']:.4g} > {guard.threshold:.4g})" if ood["is_ood"]
                   else f"known kind (score {ood['score']:.4g} <= {guard.threshold:.4g})")  # fmt: skip
        return {"verdict": verdict, "ood": ood, "neighbours": neighbours}


def build_app(engine: DemoSearch, title: str = "pml-suprank retrieval demo") -> Any:
    """The Gradio page: a query image in; the verdict, the neighbours (images with captions) and a table out. The
    search is the API endpoint ``/search`` (``gradio_client``: ``client.predict(handle_file(path),
    api_name="/search")`` → ``(verdict, gallery, table)``)."""
    import gradio as gr

    def search(image):
        if image is None:
            return "drop a query image", [], []
        result = engine.query(image)
        gallery = [(engine.gallery.get_image(n["index"]), f"#{n['rank']} {n['name']} ({n['class']}) {n['score']:.3f}")
                   for n in result["neighbours"]]  # fmt: skip
        table = [[n["rank"], n["name"], n["class"], round(n["score"], 4)] for n in result["neighbours"]]
        return result["verdict"], gallery, table

    guard = engine.model.ood_guard
    about = (f"OOD guard: {guard.detector_name}, a query is OOD when its score > {guard.threshold:.4g}."
             if guard is not None else "This model has no OOD guard: queries are not checked.")  # fmt: skip
    with gr.Blocks(title=title, analytics_enabled=False) as app:
        gr.Markdown(f"# {title}\n{len(engine.gallery)} gallery images, top {engine.k}. {about}")
        with gr.Row():
            query = gr.Image(type="pil", label="query image", elem_id="query")
            verdict = gr.Textbox(label="verdict", elem_id="verdict", interactive=False)
        neighbours = gr.Gallery(label="neighbours", elem_id="neighbours", columns=4, height="auto")
        table = gr.Dataframe(headers=["rank", "name", "class", "score"], label="neighbours (table)",
                             elem_id="table", interactive=False)  # fmt: skip
        query.change(search, inputs=query, outputs=[verdict, neighbours, table], api_name="search")
    return app


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Serve a Gradio page: drop a query image, see its neighbours in a gallery folder and the OOD "
        "guard's verdict (offline).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    env = os.environ  # noqa: TID251 - a Space's settings
    for flag, variable, what in (
        ("--model", "PML_SUPRANK_MODEL", "model folder or Hub id"),
        ("--gallery", "PML_SUPRANK_GALLERY", "folder of gallery images, flat or a sub-folder per class"),
    ):
        parser.add_argument(flag, default=env.get(variable), help=f"{what} (env {variable})")
    parser.add_argument("--k", type=int, default=8, help="neighbours shown")
    parser.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1; 0.0.0.0 on a Space)")
    parser.add_argument("--port", type=int, default=7860, help="port to listen on")
    return parser


def main(argv: list[str] | None = None, *, block: bool = True) -> Any:
    """Load, build and launch the app; returns the Gradio app (``block=False``: the server runs in a thread)."""
    from pml_suprank._terminal import refuse

    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("model", "gallery"):
        if not getattr(args, name):
            parser.error(f"--{name} is required")
    if not 1 <= args.k <= 1000:
        parser.error(f"--k: expected an int in [1, 1000]; got {args.k}")
    if not 1 <= args.port <= 65535:  # before the model is loaded and the gallery embedded
        parser.error(f"--port: expected a TCP port, an int in [1, 65535]; got {args.port}")
    try:
        import gradio  # noqa: F401
    except ImportError:
        refuse('the demo needs Gradio: pip install "pml-suprank[demo]"')
    try:
        engine = DemoSearch.load(args.model, args.gallery, k=args.k)
    except (OSError, ValueError, TypeError) as e:
        refuse(e)
    host = args.host or ("0.0.0.0" if os.environ.get("SPACE_ID") else "127.0.0.1")  # noqa: TID251, S104 - a Space
    app = build_app(engine)
    app.launch(server_name=host, server_port=args.port, share=False, prevent_thread_lock=not block,
               show_error=True)  # fmt: skip
    return app


def run() -> None:
    """The console script ``pml-suprank-demo``: :func:`main` on the process's arguments."""
    main()


if __name__ == "__main__":
    run()

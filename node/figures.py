"""Plots for the reports mqnode writes (the load test's, the pipeline's summary): each saved as a
PNG beside the report, and embedded in its self-contained HTML page, so the page can be mailed
on its own."""

from __future__ import annotations

import base64
import html
from pathlib import Path


def save(fig, path: Path, plt) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def embedded(output: Path, plots: dict[str, str]) -> str:
    """`<figure>`s with the PNGs of `plots` (file name -> title) that exist in `output`."""
    e = html.escape
    images = ""
    for name, title in plots.items():
        path = output / name
        if path.exists():
            data = base64.b64encode(path.read_bytes()).decode("ascii")
            images += f'<figure><img alt="{e(title)}" src="data:image/png;base64,{data}"><figcaption>{e(title)}</figcaption></figure>'
    return images

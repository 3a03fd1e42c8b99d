"""HTML snippets for the explorer's widgets: a frame as a captioned table, a view's tokens."""
from __future__ import annotations

import html

import pandas as pd

from studylib.tools.explorer.view import RoutingView


def table_html(df: pd.DataFrame, caption: str = "", gradient: bool = False, digits: int = 3) -> str:
    """``df`` as a captioned HTML table (a 0..1 blue gradient with ``gradient``); an empty frame
    shows its ``attrs["status"]``."""
    if df is None or df.empty:
        msg = (df.attrs.get("status") if df is not None else None) or "(empty)"
        return f"<div><b>{html.escape(caption)}</b><br><i>{html.escape(msg)}</i></div>"
    try:
        sty = df.style.format(precision=digits, na_rep="-")
        if gradient:
            sty = sty.background_gradient(cmap="Blues", axis=None, vmin=0.0, vmax=1.0)
        body = sty.to_html()
    except Exception:  # no jinja2: plain table
        body = df.to_html(float_format=lambda x: f"{x:.{digits}f}", na_rep="-")
    return f"<div><b>{html.escape(caption)}</b>{body}</div>"


def tokens_html(view: RoutingView) -> str:
    """The view's tokens as text, generated ones in red; with the decoded continuation if any."""
    spans = []
    for t, piece in enumerate(view.tokens):
        style = "color:#888" if t < view.n_prefix else (
            "color:#b2182b;font-weight:bold" if view.n_prompt is not None and t >= view.n_prompt else "")
        spans.append(f'<span class="studylib-token" style="{style}">{html.escape(piece)}</span>')
    out = f'<div class="studylib-tokens">{len(view.ids)} tokens: ' + " ".join(spans) + "</div>"
    if view.n_prompt is not None:
        out += (f'<div class="studylib-continuation"><b>{html.escape(view.text)}</b>'
                f'<span style="color:#b2182b">{html.escape(view.continuation)}</span></div>')
    if view.truncated:
        out += f"<div><i>{view.truncated} tokens cut to fit the model context</i></div>"
    return out

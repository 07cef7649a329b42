"""The HTML page of a scan: throughput against peak memory per family, Pareto frontier drawn."""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc_
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ..analysis.frontier import pareto_front
from ..core.ops import InputError
from .page import CSS as _CSS
from .page import PALETTE as _PALETTE
from .page import plotly_js as _plotly_js

__all__ = ["scan_report"]

_NEEDED = ["schedule", "devices", "microbatches", "network", "memory_max", "makespan",
           "throughput"]
_HOVER = ["chunks", "f", "b", "w", "comm", "memory_limit", "bubble_ratio"]
# Points drawn per family and shape beyond the frontier (a million-row scan
# would make a page no browser opens): an even sample, frontier always kept.
MAX_POINTS = 1500


def _read(source) -> pa.Table:
    if isinstance(source, pa.Table):
        return source
    folder = Path(source)
    if not folder.is_dir():
        raise FileNotFoundError(f"scan directory {str(folder)!r} does not exist")
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        raise InputError(f"{str(folder)!r} holds no scan parts (part-*.parquet): run "
                         "'pipecore scan GRID --out DIR' first")
    check = f"'pipecore verify {folder}' checks every part"
    tables = []
    for f in files:
        try:
            tables.append(pq.read_table(f))
        except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
            raise InputError(f"cannot read scan part {f}: {exc} ({check})") from None
    # One schema in every part: name the part that differs from the most common
    # one (a damaged footer still reads, with a column of another type).
    schemas = [t.schema.remove_metadata() for t in tables]
    texts = [sch.to_string() for sch in schemas]
    usual = schemas[texts.index(Counter(texts).most_common(1)[0][0])]
    for f, sch, text in zip(files, schemas, texts):
        if text != usual.to_string():
            diff = next((f"column {a.name!r} has type {a.type} where the other parts' is {b.type}"
                         for a, b in zip(sch, usual) if a.name == b.name and a.type != b.type),
                        f"its columns ({', '.join(sch.names)}) differ from the other parts'")
            raise InputError(f"scan part {f} does not match the other parts: {diff} ({check}; "
                             f"a resume recomputes a part that fails it)")
    return pa.concat_tables(tables, promote_options="default")


def scan_report(source, path, *, metric: str = "throughput") -> Path:
    """Write a self-contained HTML page of a scan and its Pareto frontier.

    Throughput (or makespan) against the worst device's memory, one colour
    per family, the frontier of each shape (devices, microbatches,
    network) drawn as a line; selectors show one shape at a time; hover
    gives the configuration. The frontier rows are also written beside the
    page as ``<stem>_frontier.parquet`` and ``<stem>_frontier.csv``.

    Parameters
    ----------
    source : str, pathlib.Path or pyarrow.Table
        A scan's output folder (``part-*.parquet``) or its rows.
    path : str or pathlib.Path
        The HTML file to write.
    metric : {"throughput", "makespan"}, default "throughput"
        The y axis: higher throughput or lower makespan is better.

    Returns
    -------
    pathlib.Path
        The page written.

    Raises
    ------
    FileNotFoundError
        If the folder does not exist.
    ValueError
        If it holds no parts, a part cannot be read or its columns differ
        from the other parts' (naming the file), rows lack a needed column,
        the scan is empty, or ``metric`` is unknown.
    """
    if metric not in ("throughput", "makespan"):
        raise InputError(f"metric must be 'throughput' or 'makespan' (got {metric!r})")
    table = _read(source)
    missing = [c for c in _NEEDED if c not in table.column_names]
    if missing:
        raise InputError(f"scan rows lack the column(s) {missing}: not a pipecore scan")
    if table.num_rows == 0:
        raise InputError("the scan has no rows: nothing to draw")
    table = table.filter(pc_.is_finite(table.column("makespan")))
    cols = {c: table.column(c).to_pylist() for c in ["schedule", "network"]}
    p = table.column("devices").to_numpy()
    m = table.column("microbatches").to_numpy()
    x = table.column("memory_max").to_numpy()
    y = table.column(metric).to_numpy()
    better = -y if metric == "throughput" else y  # pareto_front minimises both
    hover = {c: table.column(c).to_numpy() for c in _HOVER if c in table.column_names}
    families = sorted(set(cols["schedule"]))
    colour = {f: _PALETTE[i % len(_PALETTE)] for i, f in enumerate(families)}
    sched = np.asarray(cols["schedule"], dtype=object)
    net = np.asarray([str(v) for v in cols["network"]], dtype=object)
    shapes = sorted({(int(a), int(b), str(c)) for a, b, c in zip(p, m, net)})
    traces, meta, front_rows = [], [], []
    rng = np.random.default_rng(0)
    for (sp, sm, sn) in shapes:
        in_shape = (p == sp) & (m == sm) & (net == sn)
        idx = np.flatnonzero(in_shape)
        front = idx[pareto_front(x[idx], better[idx])]
        front_rows.extend(front.tolist())
        on_front = np.zeros(len(x), dtype=bool)
        on_front[front] = True
        label = f"p={sp} m={sm} {sn}"
        for fam in families:
            sel = np.flatnonzero(in_shape & (sched == fam))
            if sel.size == 0:
                continue
            if sel.size > MAX_POINTS:
                keep = sel[on_front[sel]]
                rest = sel[~on_front[sel]]
                sel = np.sort(np.concatenate([keep, rng.choice(rest, MAX_POINTS, replace=False)]))
            text = ["<br>".join([f"{fam} ({label})"]
                                + [f"{k} {hover[k][i]:.4g}" for k in hover]
                                + [f"memory {x[i]:.4g}", f"{metric} {y[i]:.4g}"]) for i in sel]
            traces.append({"type": "scattergl" if sel.size > 2000 else "scatter",
                           "mode": "markers", "name": fam, "legendgroup": fam,
                           "x": [float(f"{v:.6g}") for v in x[sel]],
                           "y": [float(f"{v:.6g}") for v in y[sel]],
                           "marker": {"color": colour[fam], "size": 7, "opacity": 0.75},
                           "text": text, "hovertemplate": "%{text}<extra></extra>"})
            meta.append([sp, sm, sn])
        order = front[np.argsort(x[front], kind="stable")]
        traces.append({"type": "scatter", "mode": "lines", "name": f"frontier {label}",
                       "x": [float(f"{v:.6g}") for v in x[order]],
                       "y": [float(f"{v:.6g}") for v in y[order]],
                       "line": {"color": "#111111", "width": 2, "shape": "hv"},
                       "hoverinfo": "skip", "showlegend": False})
        meta.append([sp, sm, sn])
    first = shapes[0]
    visible = [mt == list(first) for mt in meta]
    for t, v in zip(traces, visible):
        t["visible"] = v
    # Legend: one entry per family, not one per shape.
    seen = set()
    for t in traces:
        if t.get("legendgroup"):
            t["showlegend"] = t["legendgroup"] not in seen
            seen.add(t["legendgroup"])
    ylabel = ("throughput (microbatches per cost unit; higher is better)" if metric == "throughput"
              else "makespan (cost units; lower is better)")
    layout = {"height": 620, "margin": {"l": 80, "r": 20, "t": 30, "b": 55},
              "xaxis": {"title": {"text": "memory of the worst device (M: one microbatch's "
                                          "activation, plus weights)"}},
              "yaxis": {"title": {"text": ylabel}}, "hovermode": "closest",
              "plot_bgcolor": "#ffffff", "legend": {"font": {"size": 11}}}
    frontier = table.take(pa.array(sorted(front_rows), type=pa.int64()))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    stem = out.with_suffix("")
    pq.write_table(frontier, f"{stem}_frontier.parquet")
    flat = frontier
    for i, field in enumerate(flat.schema):  # CSV takes no dictionary columns
        if pa.types.is_dictionary(field.type):
            flat = flat.set_column(i, field.name, flat.column(i).cast(pa.string()))
    pacsv.write_csv(flat, f"{stem}_frontier.csv")

    def options(values):
        return "".join(f"<option value='{html.escape(str(v))}'>{html.escape(str(v))}</option>"
                       for v in values)

    selects = (f"<label>devices <select id='sel-p'><option value='*'>all</option>"
               f"{options(sorted({s[0] for s in shapes}))}</select></label> "
               f"<label>microbatches <select id='sel-m'><option value='*'>all</option>"
               f"{options(sorted({s[1] for s in shapes}))}</select></label> "
               f"<label>network <select id='sel-n'><option value='*'>all</option>"
               f"{options(sorted({s[2] for s in shapes}))}</select></label>")
    glue = ("var META=" + json.dumps(meta) + ";function pick(){var p=document.getElementById"
            "('sel-p').value,m=document.getElementById('sel-m').value,n=document.getElementById"
            "('sel-n').value;var v=META.map(function(t){return (p==='*'||String(t[0])===p)&&"
            "(m==='*'||String(t[1])===m)&&(n==='*'||t[2]===n);});Plotly.restyle('scan',"
            "{visible:v});}['sel-p','sel-m','sel-n'].forEach(function(i){document."
            "getElementById(i).addEventListener('change',pick);});"
            f"document.getElementById('sel-p').value='{first[0]}';document.getElementById"
            f"('sel-m').value='{first[1]}';document.getElementById('sel-n').value="
            f"{json.dumps(first[2])};")
    n_rows = table.num_rows
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>pipecore scan</title>"
        f"<style>{_CSS} label{{margin-right:14px;font-size:14px}}</style>"
        f"<script>{_plotly_js()}</script></head><body>"
        f"<h1>pipecore scan: {n_rows:,} configurations, {len(families)} families</h1>"
        "<p class='sub'>Each dot is one configuration; the black line is the Pareto frontier of "
        "the shape shown (nothing else is both faster and lighter). Frontier rows: "
        f"{html.escape(Path(f'{stem}_frontier.csv').name)} and .parquet beside this page. "
        f"Pick a shape:</p><p>{selects}</p><div id='scan'></div>"
        f"<script>Plotly.newPlot('scan',{json.dumps(traces, separators=(',', ':'))},"
        f"{json.dumps(layout)},{{\"responsive\":true,\"displaylogo\":false}});{glue}</script>"
        "</body></html>")
    out.write_text(page, encoding="utf-8")
    return out

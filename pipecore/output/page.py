"""What every HTML page of pipecore shares: the inlined plotly.js and the style sheet."""

from __future__ import annotations

from .errors import MissingDependencyError

__all__ = ["CSS", "PALETTE", "plotly_js"]

# Kelly's colours of maximum contrast (white and black left out): 20 that
# stay apart, for the 17 families of a scan or a study.
PALETTE = ["#0067a5", "#f38400", "#008856", "#be0032", "#875692", "#882d17", "#e68fac",
           "#848482", "#8db600", "#a1caf1", "#f3c300", "#604e97", "#f99379", "#2b3d26",
           "#b3446c", "#c2b280", "#e25822", "#654522", "#dcd300", "#f6a600"]


def plotly_js() -> str:
    """plotly.js, minified, to inline in a page (pages then open offline)."""
    try:
        from plotly.offline import get_plotlyjs
    except ImportError as exc:
        raise MissingDependencyError(
            "HTML reports need plotly: pip install 'pipecore[plot]'") from exc
    return get_plotlyjs()


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px;color:#222;
max-width:1400px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 6px;border-top:1px solid #ddd;
padding-top:16px}.sub{color:#555;margin:0 0 14px}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 9px;text-align:right;
border-bottom:1px solid #eee}th:first-child,td:first-child{text-align:left}
table.summary th{cursor:pointer;background:#f4f6f8;user-select:none}
table.summary th:hover{background:#e6ebf0}.no{color:#b22222;font-weight:600}.yes{color:#2e7d32}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:6px 10px;margin:8px 0;font-size:13px}
.foot{font-size:12px;color:#555;margin:4px 0}.views{margin:6px 0 10px}
.views td,.views th{text-align:right}.plot{width:100%}
.legendtext{font-size:12px}
.headline{background:#eef5ee;border-left:4px solid #2e7d32;padding:6px 12px;margin:10px 0 14px;
font-size:14px}.headline p{margin:3px 0}
.setting{font-size:12px;color:#444;margin:2px 0 8px}
th .unit{display:block;font-weight:normal;font-size:11px;color:#666}
table.summary th{max-width:150px;vertical-align:bottom}
table.summary td:first-child{white-space:nowrap}
table.summary .setting{text-align:left}
table.summary td.setting{font-size:12px;color:#444;max-width:520px}
.fm{color:#666;white-space:nowrap}td.none{color:#777;font-style:italic}
table.views td.none{text-align:left;max-width:220px}table.summary td.none{text-align:center}
"""

"""Draw docs/readme.png, the README's one picture: 1F1B and ZB-V on 4 devices
with 8 microbatches on one time axis, so the idle time (white) that a
zero-bubble schedule removes, and the time it saves, are the first thing a
newcomer sees.

Run from the repository's root after a change to the schedules or colours:
``python docs/readme_figure.py``. Colours and chunk shades are pipecore's
(``pipecore.output.colours``), as in every Gantt chart it draws; the charts
share their time axis, which two ``Result.write_gantt`` pictures cannot.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

import pipecore as pc  # noqa: E402
from pipecore.output.colours import KIND_COLOURS, chunk_of, shade_hex  # noqa: E402

OUT = Path(__file__).resolve().parent / "readme.png"
COSTS = pc.Costs(f=1.0, b=1.0, w=1.0)  # the zero-bubble papers' unit setting
FAMILIES = ("1f1b", "zb-v")


def main() -> None:
    results = [pc.simulate(pc.build(f, devices=4, microbatches=8), COSTS) for f in FAMILIES]
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 4.4), sharex=True,
                             layout="constrained")
    for ax, res in zip(axes, results, strict=True):
        ops = res.ops.to_pydict()
        chunk = chunk_of(np.asarray(ops["device"]), np.asarray(ops["stage"]))
        for d, k, mb, s, f, c in zip(ops["device"], ops["kind"], ops["microbatch"], ops["start"],
                                     ops["finish"], chunk, strict=True):
            colour = shade_hex(KIND_COLOURS[k], 0.45 * c)
            ax.barh(d, f - s, left=s, height=0.8, color=colour, edgecolor="white", lw=0.6)
            ax.text((s + f) / 2, d, str(mb), ha="center", va="center", fontsize=6.5,
                    color="white" if c == 0 else "black")
        ax.set_yticks(range(4), [f"device {d}" for d in range(4)], fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{res.name}: {res.makespan:g} cost units, {res.bubble_ratio:.0%} idle",
                     loc="left", fontsize=10)
        ax.spines[["top", "right"]].set_visible(False)
    axes[-1].set_xlabel("time (cost units; f = b = w = 1 per microbatch and device share)",
                        fontsize=8)
    kinds = [Patch(color=KIND_COLOURS[k], label=k) for k in ("F", "B", "W", "BW")]
    kinds.append(Patch(color=shade_hex("#606060", 0.45), label="second chunk (lighter)"))
    fig.legend(handles=kinds, loc="outside right center", fontsize=8, frameon=False)
    fig.suptitle("pipecore: 4 devices, 8 microbatches; numbers are microbatches", fontsize=10)
    fig.savefig(OUT, dpi=120)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()

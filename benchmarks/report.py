"""Turns the suite's results into docs/benchmarks/README.md and its plots.

  python -m benchmarks.report --results=docs/benchmarks/results.json

Everything here reads the results JSON only, so a report can be redrawn
without measuring again. Figures are medians over rounds, with the range
(min-max) next to them; ratios are medians of per-round ratios.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from absl import app, flags

from benchmarks import engines, precision_section, scaling_model, speedup, stacks, storage_section
from benchmarks.options_table import HARDWARE_LIMIT, LARGER_BATCH, OPTIONS, REFERENCES

#: Gradient bytes per all-reduce (float32 trainable parameters).
GRADIENT_BYTES = {"mnist_cnn": 347_146 * 4, "resnet_cifar": 272_762 * 4}


def _range(summary: Dict[str, float], digits: int = 2, thousands: bool = False) -> str:
    if thousands:
        return f"{summary['median']:,.0f} ({summary['min']:,.0f}-{summary['max']:,.0f})"
    return (
        f"{summary['median']:.{digits}f} ({summary['min']:.{digits}f}-{summary['max']:.{digits}f})"
    )


def _met(value: float, target: float, at_most: bool = False) -> str:
    return "yes" if (value <= target if at_most else value >= target) else "**no**"


def _weak_curve(results: dict, model: str, communication: str = "RING") -> Optional[dict]:
    for curve in results.get("scaling", {}).get("curves", []):
        key = (curve["model"], curve["communication"], curve["mode"])
        if key == (model, communication, "weak"):
            return curve
    return None


def fitted_networks(results: dict) -> List[scaling_model.Network]:
    """Ring models fitted to the measured 2-worker all-reduces."""
    collectives = results.get("collectives")
    if not collectives:
        return []
    networks = []
    for name, rows in collectives["allreduce"].items():
        if "3 workers" in name:
            continue
        seconds = [row["median"] for row in rows]
        # Latency-bound sizes and 1 MiB or more: the fit's two regimes.
        nbytes = collectives["bytes"]
        if "bfloat16" in name:
            nbytes = [b / 2 for b in nbytes]
        networks.append(scaling_model.fit_ring(f"{name} (fitted)", nbytes, seconds))
    return networks


def model_check(results: dict) -> List[dict]:
    """Predicted against measured weak-scaling efficiency at 2 and 3 workers."""
    networks = {n.name: n for n in fitted_networks(results)}
    ring = networks.get("RING float32 (fitted)")
    cores = results.get("scaling", {}).get("cores", 0)
    rows = []
    for model, nbytes in GRADIENT_BYTES.items():
        curve = _weak_curve(results, model)
        if curve is None or ring is None:
            continue
        batch = curve["global_batch"][0]
        compute = batch / curve["throughput"][0]["median"]
        for index, workers in enumerate(curve["workers"]):
            if workers < 2:
                continue
            rows.append(
                {
                    "model": model,
                    "workers": workers,
                    "compute_ms": compute * 1e3,
                    "allreduce_ms": scaling_model.ring_allreduce_seconds(ring, workers, nbytes)
                    * 1e3,
                    "predicted": scaling_model.efficiency(
                        compute, ring, workers, nbytes, cores=cores
                    ),
                    "measured": curve["efficiency"][index]["median"],
                }
            )
    return rows


def options_check(results: dict) -> List[dict]:
    """Predicted against measured 2-worker efficiency of each pinned option (mnist_cnn).

    The model sees what an option changes in its terms: the compute of a step
    (one worker's measured time for the option's per-worker batch), the bytes
    on the wire (halved by bfloat16), and all-reduces per step (1/k with
    accumulation). What it leaves out shows as the gap to the measurement.
    """
    networks = {n.name: n for n in fitted_networks(results)}
    options = results.get("options")
    if not options or "RING float32 (fitted)" not in networks:
        return []
    rows = []
    for row in options["options"]:
        flags, fields, _ = OPTIONS.get(row["option"], ((), {"pin": False}, ""))
        if not fields.get("pin", True) or fields.get("contender", "package") != "package":
            continue
        flags = dict(flags)
        wire = flags.get("gradient_wire_dtype", "float32")
        network = networks.get(f"RING {wire} (fitted)", networks["RING float32 (fitted)"])
        nbytes = GRADIENT_BYTES["mnist_cnn"] * (0.5 if wire != "float32" else 1.0)
        accumulation = int(flags.get("gradient_accumulation_steps", 1))
        compute = fields.get("per_worker_batch", 64) / row["one_worker"]["median"]
        rows.append(
            {
                "option": row["option"],
                "compute_ms": compute * 1e3,
                "allreduce_ms": scaling_model.ring_allreduce_seconds(network, 2, nbytes) * 1e3,
                "accumulation": accumulation,
                "predicted": scaling_model.efficiency(compute, network, 2, nbytes, accumulation),
                "measured": row["efficiency"]["median"],
            }
        )
    return rows


def predictions(results: dict) -> Dict[str, Any]:
    """Efficiency from 2 to 256 workers, per model, for the fitted RING and NCCL-class networks."""
    networks = {n.name: n for n in fitted_networks(results)}
    ring = networks.get("RING float32 (fitted)")
    workers = [2**i for i in range(1, 9)]
    out: Dict[str, Any] = {"workers": workers, "models": {}}
    for model, nbytes in GRADIENT_BYTES.items():
        curve = _weak_curve(results, model)
        if curve is None or ring is None:
            continue
        compute = curve["global_batch"][0] / curve["throughput"][0]["median"]
        lines = {}
        for network in (ring, scaling_model.NCCL_CLASS):
            for accumulation, wire in ((1, 1.0), (8, 1.0), (1, 0.5)):
                name = (
                    network.name
                    + {(1, 1.0): "", (8, 1.0): ", k=8", (1, 0.5): ", bfloat16"}[
                        (accumulation, wire)
                    ]
                )
                lines[name] = [
                    scaling_model.efficiency(compute, network, n, nbytes * wire, accumulation)
                    for n in workers
                ]
        out["models"][model] = {"compute_ms": compute * 1e3, "efficiency": lines}
    return out


def _plot_scaling(results: dict, directory: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    curves = results.get("scaling", {}).get("curves", [])
    for model in sorted({c["model"] for c in curves}):
        figure, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=False)
        for axis, mode in zip(axes, ("weak", "strong")):
            for curve in curves:
                if (curve["model"], curve["mode"]) != (model, mode):
                    continue
                medians = [t["median"] for t in curve["throughput"]]
                low = [t["median"] - t["min"] for t in curve["throughput"]]
                high = [t["max"] - t["median"] for t in curve["throughput"]]
                axis.errorbar(
                    curve["workers"],
                    medians,
                    yerr=[low, high],
                    marker="o",
                    capsize=3,
                    label=f"{curve['communication']}",
                )
            ideal = [medians[0] * n for n in curve["workers"]]
            axis.plot(curve["workers"], ideal, "k--", label="ideal (N x 1 worker)")
            axis.set_title(f"{model}, {mode} scaling")
            axis.set_xlabel("workers (one core each; 3 share 2 cores)")
            axis.set_ylabel("examples/s (all workers)")
            axis.set_xticks(curve["workers"])
            axis.legend()
            axis.grid(alpha=0.3)
        figure.tight_layout()
        path = os.path.join(directory, f"scaling_{model}.png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        paths.append(path)
    return paths


def _plot_allreduce(results: dict, directory: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    collectives = results.get("collectives")
    if not collectives:
        return []
    nbytes = collectives["bytes"]
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, rows in collectives["allreduce"].items():
        axis.loglog(nbytes, [r["median"] * 1e3 for r in rows], marker="o", label=name)
    axis.loglog(
        nbytes,
        [r["median"] * 1e3 for r in collectives["floor"]],
        "k--",
        marker="s",
        label="floor: plain loopback copy",
    )
    for network in fitted_networks(results):
        if network.name.startswith("RING float32"):
            model = [scaling_model.ring_allreduce_seconds(network, 2, b) * 1e3 for b in nbytes]
            axis.loglog(
                nbytes,
                model,
                ":",
                label=f"ring model, a={network.latency * 1e6:.0f} us, "
                f"b={network.bandwidth / 1e9:.2f} GB/s",
            )
    axis.set_xlabel("float32 gradient bytes per all-reduce")
    axis.set_ylabel("ms per all-reduce")
    axis.set_title("All-reduce time against size (2 workers, loopback)")
    axis.grid(alpha=0.3, which="both")
    axis.legend(fontsize=8)
    figure.tight_layout()
    path = os.path.join(directory, "allreduce.png")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [path]


def _plot_model(results: dict, directory: str) -> List[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    predicted = predictions(results)
    if not predicted["models"]:
        return []
    figure, axes = plt.subplots(1, len(predicted["models"]), figsize=(11, 4.5), squeeze=False)
    checks = model_check(results)
    for axis, (model, data) in zip(axes[0], predicted["models"].items()):
        for name, values in data["efficiency"].items():
            style = "-" if "NCCL" in name else "--"
            axis.semilogx(predicted["workers"], values, style, marker=".", label=name, base=2)
        measured = [(c["workers"], c["measured"]) for c in checks if c["model"] == model]
        if measured:
            axis.plot(*zip(*measured), "k*", markersize=12, label="measured here (RING)")
        axis.set_title(f"{model}: compute {data['compute_ms']:.1f} ms/step on one core")
        axis.set_xlabel("workers")
        axis.set_ylabel("weak-scaling efficiency")
        axis.set_ylim(0, 1.05)
        axis.grid(alpha=0.3, which="both")
        axis.legend(fontsize=7)
    figure.tight_layout()
    path = os.path.join(directory, "scaling_model.png")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return [path]


def plots(results: dict, directory: str) -> List[str]:
    """Writes the PNG plots into `directory`; returns their paths."""
    return (
        _plot_scaling(results, directory)
        + _plot_allreduce(results, directory)
        + _plot_model(results, directory)
    )


def _targets(results: dict) -> List[Tuple[str, str, str, str]]:
    rows = []
    for section in ("overhead", "alternatives"):
        for comparison in results.get(section, {}).get("comparisons", []):
            rows.append(
                (
                    f"{comparison['name']} (throughput ratio), 2 workers x "
                    f"{comparison['per_worker_batch']}",
                    f">= {comparison['target']:g}",
                    f"{_range(comparison)}, {len(comparison['samples'])} rounds",
                    _met(comparison["median"], comparison["target"]),
                )
            )
    options = results.get("options")
    if options:
        trained = [row for row in options["options"] if row["option"] not in REFERENCES]
        best = max(trained, key=lambda row: row["efficiency"]["median"])
        default = trained[0]
        for row in (default, best) if best is not default else (default,):
            rows.append(
                (
                    f"weak-scaling efficiency, mnist_cnn, 2 workers x 64, {row['option']}",
                    f">= {options['target']:g}",
                    _range(row["efficiency"]),
                    _met(row["efficiency"]["median"], options["target"]),
                )
            )
        references = {
            LARGER_BATCH: "the same at 512 per worker (8x the examples per synchronisation)",
            HARDWARE_LIMIT: "the same for 2 separate 1-worker jobs at once (the cores' own limit)",
        }
        for row in options["options"]:
            if row["option"] in references:
                rows.append((references[row["option"]], "reference", _range(row["efficiency"]), ""))
    start = results.get("startup")
    if start:
        rows.append(
            (
                "launcher start to first training step, 2 workers + evaluator (s)",
                f"<= {start['target']:g}",
                _range(start["first_step"], 1),
                _met(start["first_step"]["median"], start["target"], at_most=True),
            )
        )
    return rows


def _overhead_rounds(results: dict) -> str:
    rounds = results.get("overhead", {}).get("rounds")
    return f" ({rounds} in the overhead section)" if rounds else ""


def _flags(machine: dict) -> str:
    """The CPU's vector flags as the report names them; older results did not record them."""
    if "cpu_flags" not in machine:
        return "flags not recorded"
    return " ".join(machine["cpu_flags"]) or "no AVX2"


def markdown(results: dict, images: Sequence[str]) -> str:
    """The report: targets first, then every section's table."""
    settings, machine = results["settings"], results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Measured by `{results['command']}` from {results['started']} to {results['finished']} on "
        f"{machine['cores']} cores ({machine['cpu']}; {_flags(machine)}), "
        f"Python {machine['python']}, TensorFlow {machine['tensorflow']}; "
        f"{settings['rounds']} round(s)"
        f"{_overhead_rounds(results)}"
        f"{', quick' if settings['quick'] else ''}. "
        "Every figure is the median over rounds with the range (min-max); every ratio is the "
        "median of ratios taken within a round, where the compared runs ran back to back. Each run "
        "is fresh processes, one per worker, each pinned to its own core (3 workers share 2 "
        "cores), with oneDNN on, on 1024 random images in memory. Raw data: "
        "[results.json](results.json).",
    ]
    targets = _targets(results)
    if targets:  # Sections without a target of this table (precision alone) leave it out.
        lines += ["", "## Targets", "", "| target | goal | measured | met |", "|---|---|---|---|"]
        lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in targets]
    titles = {
        "overhead": "The package's own cost per step (against hand-written Estimator code)",
        "alternatives": "Against the alternatives",
    }
    for section, title in titles.items():
        if section in results:
            lines += ["", f"## {title}", "", "| run | examples/s |", "|---|---|"]
            lines += [
                f"| {r['label']} | {_range(r, thousands=True)} |" for r in results[section]["runs"]
            ]
    if "scaling" in results:
        lines += [
            "",
            "## Scaling (package defaults)",
            "",
            "Weak: per-worker batch fixed (mnist_cnn 64, resnet_cifar 32). Strong: global batch "
            "fixed (192, 96). Efficiency = throughput / (N x one worker's).",
            "",
            "| model | collectives | scaling | workers | global batch | examples/s | efficiency |",
            "|---|---|---|---|---|---|---|",
        ]
        for c in results["scaling"]["curves"]:
            for i, n in enumerate(c["workers"]):
                lines.append(
                    f"| {c['model']} | {c['communication']} | {c['mode']} | {n} | "
                    f"{c['global_batch'][i]} | {_range(c['throughput'][i], thousands=True)} | "
                    f"{_range(c['efficiency'][i])} |"
                )
    if "options" in results:
        lines += [
            "",
            "## Options (mnist_cnn, 64 examples per worker per step)",
            "",
            "| option | what it changes in the update | 1 worker | 2 workers | efficiency | "
            "2 workers / defaults |",
            "|---|---|---|---|---|---|",
        ]
        for row in results["options"]["options"]:
            lines.append(
                f"| {row['option']} | {row['update']} | "
                f"{_range(row['one_worker'], thousands=True)} | "
                f"{_range(row['two_workers'], thousands=True)} | {_range(row['efficiency'])} | "
                f"{row['speed_vs_defaults']:.2f} |"
            )
    if "collectives" in results:
        collectives = results["collectives"]
        names = list(collectives["allreduce"])
        lines += [
            "",
            "## Collective cost (ms per all-reduce; floor: one plain loopback copy of the bytes)",
            "",
            "| values | bytes | " + " | ".join(names) + " | floor | RING / floor |",
            "|---" * (len(names) + 4) + "|",
        ]
        for i, size in enumerate(collectives["sizes"]):
            cells = [f"{collectives['allreduce'][n][i]['median'] * 1e3:.3f}" for n in names]
            floor = collectives["floor"][i]["median"]
            ring = collectives["allreduce"][names[0]][i]["median"]
            lines.append(
                f"| {size:,} | {collectives['bytes'][i]:,} | "
                + " | ".join(cells)
                + f" | {floor * 1e3:.3f} | {ring / floor:.1f} |"
            )
        lines += ["", "Fitted ring model (`benchmarks.scaling_model`):", ""]
        for network in fitted_networks(results):
            lines.append(
                f"- {network.name}: latency a = {network.latency * 1e6:.0f} us per ring step, "
                f"bandwidth b = {network.bandwidth / 1e9:.2f} GB/s"
            )
    checks = model_check(results)
    if checks:
        lines += [
            "",
            "## Scaling model against measurement (weak scaling, RING)",
            "",
            "| model | workers | compute ms/step | predicted all-reduce ms | predicted "
            "| measured |",
            "|---|---|---|---|---|---|",
        ]
        for c in checks:
            lines.append(
                f"| {c['model']} | {c['workers']} | {c['compute_ms']:.2f} | "
                f"{c['allreduce_ms']:.2f} | "
                f"{c['predicted']:.2f} | {c['measured']:.2f} |"
            )
        option_checks = options_check(results)
        if option_checks:
            lines += [
                "",
                "The same model against the options (mnist_cnn, 2 workers, RING):",
                "",
                "| option | compute ms/step | predicted all-reduce ms | all-reduce every | "
                "predicted | measured |",
                "|---|---|---|---|---|---|",
            ]
            for c in option_checks:
                lines.append(
                    f"| {c['option']} | {c['compute_ms']:.2f} | {c['allreduce_ms']:.2f} | "
                    f"{c['accumulation']} step(s) | {c['predicted']:.2f} | {c['measured']:.2f} |"
                )
        predicted = predictions(results)
        lines += ["", "Predicted weak-scaling efficiency:", ""]
        for model, data in predicted["models"].items():
            lines += [
                f"**{model}** (compute {data['compute_ms']:.1f} ms per step):",
                "",
                "| network | " + " | ".join(str(n) for n in predicted["workers"]) + " |",
                "|---" * (len(predicted["workers"]) + 1) + "|",
            ]
            for name, values in data["efficiency"].items():
                lines.append(f"| {name} | " + " | ".join(f"{v:.2f}" for v in values) + " |")
            lines.append("")
    if "startup" in results:
        runs = results["startup"]["runs"]
        phases = list(runs[0]["tasks"].get("chief-0", {}).get("phases", {}))
        lines += [
            "",
            "## Start-up (launcher start to first training step)",
            "",
            "| run | first step (s) | chief: " + " | ".join(phases) + " |",
            "|---" * (len(phases) + 2) + "|",
        ]
        for i, run in enumerate(runs):
            chief = run["tasks"].get("chief-0", {}).get("phases", {})
            cells = " | ".join(f"{chief.get(p, 0):.1f}" for p in phases)
            lines.append(f"| {i} | {run['first_step']:.1f} | {cells} |")
    if "input" in results:
        lines += ["", "## Input pipeline against training", "", results["input"]["table"]]
    if "speedup" in results:
        lines += ["", "## MobileNetV2 training time and speed-up (issue 19's table)", ""]
        lines += speedup.table(results["speedup"])
    if "engines" in results:
        lines += ["", "## Ray against the local launcher (issue 17)", ""]
        lines += engines.table(results["engines"])
    if "precision" in results:
        lines += ["", "## Mixed precision: bfloat16 against float32 and Keras (issue 27)", ""]
        lines += precision_section.table(results["precision"])
    if "stacks" in results:
        lines += ["", "## TensorFlow 2.21 against TensorFlow 2.15 (issue 33)", ""]
        lines += stacks.table(results["stacks"])
    if "storage" in results:
        lines += ["", "## model_dir on S3 against a local model_dir (issue 35)", ""]
        lines += storage_section.table(results["storage"])
    lines += ["", "## Plots", ""]
    lines += [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in images]
    return "\n".join(lines) + "\n"


def write_report(results: dict, directory: str) -> str:
    """Writes README.md and the plots next to each other; returns the README's path."""
    os.makedirs(directory, exist_ok=True)
    images = plots(results, directory)
    path = os.path.join(directory, "README.md")
    with open(path, "w", encoding="utf-8") as stream:
        stream.write(markdown(results, images))
    return path


_RESULTS = flags.DEFINE_string("results", "docs/benchmarks/results.json", "The suite's results.")


def main(argv: Sequence[str]) -> None:
    """Redraws the report from a results file, into the file's directory."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}", exitcode=2)
    with open(_RESULTS.value, encoding="utf-8") as stream:
        results = json.load(stream)
    print(write_report(results, os.path.dirname(os.path.abspath(_RESULTS.value))))


if __name__ == "__main__":
    app.run(main)

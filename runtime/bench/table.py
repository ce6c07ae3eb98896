"""The table `convgen bench` prints from its report (bench.py): the header naming machine, method
and ratio, the column heads, a row per shape and a summary line per suite."""

from __future__ import annotations

def header(report: dict) -> str:
    p = report["peak"]
    if "device" in report["machine"]:
        d = report["machine"]["device"]
        return (f"convgen {report['convgen']} vs torch {report['torch']} on {d['name']} (compute capability "
                f"{'.'.join(map(str, d['capability']))}; torch's CUDA {d['torch_cuda']}, cuDNN {d['cudnn']}), "
                f"generated for {report['target']}, {report['dtype']}, {report['layout']}\n"
                f"median of {report['repeat']} samples (each >= {report['min_time_s']} s, between device "
                f"synchronisations), torch and convgen alternating; backward = grad input + weight + bias\n"
                f"ratio = torch ms / convgen ms (above 1: convgen is faster); % peak: of {p['gflops']:.0f} GFLOP/s "
                f"({p['pct_peak_basis']}); rel err: convgen's worst result vs float64 ATen ('!': above tolerance)")
    theory = (f"; nominal {p['theoretical_gflops']:.1f} GFLOP/s = {p['theoretical_basis']}"
              if p["theoretical_gflops"] else "")
    m = report["machine"]
    return (f"convgen {report['convgen']} vs torch {report['torch']} on {m['cpu']} (host class "
            f"{m['host_class']['label']}, {m['host_class']['vendor'] or 'vendor unknown'} family {m['host_class']['family']}; torch's CPU kernels {m['torch_cpu_capability']}, bf16 convolutions in "
            f"oneDNN: {'yes' if m['torch_onednn_bf16'] else 'no'}), generated for {report['target']}, "
            f"{report['threads']} thread(s), {report['dtype']}, {report['layout']}\n"
            f"median of {report['repeat']} samples (each >= {report['min_time_s']} s), torch and convgen "
            f"alternating; backward = grad input + weight + bias\n"
            f"peak (f32 FMA probe, {p['threads']} thread(s)): {p['gflops']:.1f} GFLOP/s{theory}\n"
            f"ratio = torch ms / convgen ms (above 1: convgen is faster); % peak: of {p['pct_peak_of_gflops']:.1f} "
            f"GFLOP/s; rel err: convgen's worst result vs float64 ATen ('!': above tolerance)")


def width(names) -> int:
    return max([len(n) for n in names] + [5])


_COLUMNS = ("fwd torch", "fwd cg", "fwd x", "bwd torch", "bwd cg", "bwd x", "bwd GF/s", "% peak", "rel err")
_UNITS = ("ms", "ms", "", "ms", "ms", "", "", "", "")
_WIDTHS = (10, 10, 7, 10, 10, 7, 10, 8, 10)


def columns(w: int) -> str:
    names = "".join(f"{c:>{n}}" for c, n in zip(_COLUMNS, _WIDTHS))
    units = "".join(f"{u:>{n}}" for u, n in zip(_UNITS, _WIDTHS))
    return f"{'shape':<{w}}{names}\n{'':<{w}}{units}".rstrip()


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _num(v: float) -> str:
    """Three significant digits below 100, whole tenths above: 0.0123, 4.56, 78.9, 1234.5."""
    return f"{v:.3g}" if v < 100 else f"{v:.1f}"


def table_row(row: dict, w: int) -> str:
    if "results" not in row:
        return f"{row['name']:<{w}}  error: {row['error']}"
    f, b = row["results"]["forward"], row["results"]["backward"]
    err = max(row["rel_error"].values())
    cells = (_ms(f["torch_ms"]), _ms(f["convgen_ms"]), f"{f['ratio_torch_over_convgen']:.2f}",
             _ms(b["torch_ms"]), _ms(b["convgen_ms"]), f"{b['ratio_torch_over_convgen']:.2f}",
             _num(b["convgen_gflops"]), f"{b['convgen_pct_peak']:.1f}%",
             f"{err:.1e}{'' if row['within_tolerance'] else ' !'}")
    return f"{row['name']:<{w}}" + "".join(f"{c:>{n}}" for c, n in zip(cells, _WIDTHS))


def summary_line(s: dict, label: str = "geomean torch/convgen") -> str:
    if not s["timed"]:
        return f"{label}: none ({s['errors']} shape(s) failed)"
    text = (f"{label} ({s['timed']} shape(s)): forward {s['geomean_forward']:.2f}x, backward "
            f"{s['geomean_backward']:.2f}x; min: forward {s['min_forward']['ratio']:.2f}x "
            f"({s['min_forward']['name']}), backward {s['min_backward']['ratio']:.2f}x ({s['min_backward']['name']})")
    if s["errors"]:
        text += f"; {s['errors']} shape(s) failed"
    if s["outside_tolerance"]:
        text += f"; outside tolerance: {', '.join(s['outside_tolerance'])}"
    return text

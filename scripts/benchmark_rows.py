"""The rows of docs/benchmarks.md that each suite of scripts/device/run.sh measures.

rows_of_report(report) turns one suite report ($OUT/<suite>.json: `suite`,
`commit`, `date`, `steps` with each step's `result`, the JSON its program
wrote) into result rows for scripts/benchmarks_page.py. Each row spec names
the row's id in its results file, its area and what it measures, the step
whose result holds it, and how its figure and detail are read from that
result. Only steps that passed count; a figure missing from a result leaves
its row as it was.
"""


def ms_row(result, name):
    """A bench_http_viewer row's client p50, with p90, min and the daemon's total."""
    row = next(r for r in result["rows"] if r["name"] == name)
    client, total = row["client_ms"], row["server_ms"].get("total", {}).get("p50")
    detail = f"p90 {client['p90']:.3f}, min {client['min']:.3f}"
    return round(client["p50"], 3), detail + (f"; daemon {total:.2f}" if total is not None else "")


def seconds_range(samples, key):
    values = sorted(sample[key] for sample in samples)
    return f"{values[0]:.3f}–{values[-1]:.3f}" if values[0] != values[-1] else round(values[0], 3)


def http_rows():
    """bench-http: every request row of bench_http_viewer, the cold rows, the floors and wrk."""
    names = [
        ("bf", "BF"), ("abf", "ABF"), ("adf", "ADF"), ("haadf", "HAADF"), ("df", "DF"),
        ("annulus", "annulus shape"), ("bf-scan-bin-2", "BF scan_bin 2"), ("comx", "CoMx (computed plan)"),
        ("comy", "CoMy (computed plan)"), ("commag", "CoMmag"), ("dpc", "DPC"), ("icom", "iCoM"),
        ("bf-fresh-crop", "BF fresh plan (new crop)"), ("comx-fresh-crop", "CoMx fresh plan (new crop)"),
        ("cbed-new-position", "cbed new position"), ("cbed-scattered", "cbed scattered position"),
        ("cbed-region-mean-r5", "cbed-region mean r=5"), ("cbed-region-64", "cbed-region rectangle 64x64"),
        ("bf-cache-hit", "BF again (image-cache hit)"), ("bf-304", "BF If-None-Match (304)"),
        ("cache-fill", "image-cache fill (first 64 images)"),
        ("products-json", "products BF+ABF+ADF+CoMx+CoMy+iCoM, one request"),
        ("products-npz", "products BF+ABF+ADF+CoMx+CoMy+iCoM, one request (npz)"),
        ("products-raw", "products BF+ABF+ADF+CoMx+CoMy+iCoM, one request (raw)"),
        ("six-singles", "six single requests in sequence (BF, ABF, ADF, CoMx, CoMy, iCoM)"),
    ]
    step = "http_spin1000_default"
    specs = [(rid, "products", name, step, "ms", lambda r, n=name: ms_row(r, n)) for rid, name in names]
    specs += [
        ("cold-start", "load", "cold start: process start → first BF body", step, "s",
         lambda r: (seconds_range(r["cold_start"], "start_to_first_bf_body_s"), None)),
        ("first-bf-ready", "load", "first BF request on a ready daemon, load included", step, "s",
         lambda r: (seconds_range(r["first_bf_on_a_ready_daemon"], "first_bf_request_including_load_s"), None)),
        ("cold-crop-512", "cold-crop", "cold 128×128 crop of the 512² u16 source, request → BF body", step, "s",
         lambda r: (seconds_range(r["cold_crop"]["samples"], "crop_bf_request_s"), None)),
        ("cold-crop-512-full", "cold-crop", "its full-scan BF right after, from the crop's request", step, "s",
         lambda r: (seconds_range(r["cold_crop"]["samples"], "crop_to_full_bf_body_s"), None)),
        ("loopback-1mib", "products", "loopback floor: a ready-made 1 MiB response over TCP", "loopback_floor", "ms",
         lambda r: (round(r["1048576"]["p50"], 3), f"min {r['1048576']['min']:.3f}")),
        ("loopback-147k", "products", "loopback floor, 147 KB (a cbed body)", "loopback_floor", "ms",
         lambda r: (round(r["147456"]["p50"], 3), f"min {r['147456']['min']:.3f}")),
        ("wrk", "soak", "wrk, 64 connections over the viewer's mixed routes, `serve --gpus auto`", "wrk_gpu",
         "requests", lambda r: (r["requests"], wrk_detail(r))),
    ]
    return specs


def wrk_detail(r):
    errors = sum(v for k, v in r.items() if k.startswith("errors_"))
    return (f"{errors} errors, p50 {r['p50_ms']:.2f} / p99 {r['p99_ms']:.1f} ms, "
            f"{r['sampled_bodies'] - r['body_mismatches']} of {r['sampled_bodies']} sampled bodies identical, "
            f"RSS {r['rss_kib_before'] / 1024:.1f} → {r['rss_kib_after'] / 1024:.1f} MiB")


def peaks(r):
    """Largest reservation ÷ measured peak, with the admitted estimate and the resident."""
    gb = lambda key: r[key] / 1e9
    detail = (f"admitted {gb('admitted_peak_bytes'):.2f} GB, reservation {gb('reserved_peak_bytes'):.2f} GB, "
              f"measured {gb('measured_peak_bytes_cudaMemGetInfo'):.2f} GB, resident {gb('resident_bytes'):.2f} GB")
    return round(r["reserved_peak_bytes"] / r["measured_peak_bytes_cudaMemGetInfo"], 2), detail


def primitive(key, without=None):
    def read(r):
        p = r["request_primitives_ms"]
        return round(p[key], 3), (f"without tile sums {p[without]:.2f}" if without else None)
    return read


def load_rows():
    """bench-load: cuda_backend_bench's loads, resident sizes, peaks and request primitives."""
    u16, u32 = "load_u16_512", "load_u32_128x512"
    median = lambda r: (round(r["load_seconds_median"], 3), None)
    return [
        ("load-512-u16", "load", "load 512² u16 to resident, in-process (median of 5)", u16, "s", median),
        ("load-128x512-u32", "load", "load 128×512×192×192 u32, dense preset (the encoder's worst case)", u32, "s",
         median),
        ("load-1024-u16", "load", "load 1024×1024×192×192 u16 (77.3 GB dense), one GPU, no bin", "load_u16_1024",
         "s", lambda r: (round(r["load_seconds_median"], 3), f"resident {r['resident_bytes'] / 1e9:.2f} GB")),
        ("resident-512", "load", "whole resident, 512² u16", u16, "GB",
         lambda r: (round(r["resident_bytes"] / 1e9, 3), f"{r['resident_over_stored']:.3f} of the stored bytes")),
        ("peaks-512", "admission", "512×512×192×192 u16 realistic: largest reservation ÷ measured peak", u16, "",
         peaks),
        ("peaks-128x512", "admission", "128×512×192×192 u32 dense: largest reservation ÷ measured peak", u32, "",
         peaks),
        ("masked-sum-u32-bf", "primitives", "BF masked sum narrowed to uint32 (`masked_sum_u32`, full scan)", u16,
         "ms", primitive("masked_sum_u32_bf")),
        ("frame-along-row", "primitives", "a frame along a scan row (from the recent frames)", u16, "ms",
         primitive("frame_u32_along_row")),
        ("frame-new-position", "primitives", "a frame at a new position (its segment decoded from the seek point)",
         u16, "ms", primitive("frame_new_position")),
        ("frame-at-seek-point", "primitives", "a frame at a seek point (the path's fixed cost)", u16, "ms",
         primitive("frame_at_seek_point")),
        ("pattern-sum-half-crop", "primitives", "a half-scan crop's pattern sum, with tile sums", u16, "ms",
         primitive("pattern_sum_half_crop_with_tile_sums", "pattern_sum_half_crop")),
        ("region-sum-64", "primitives", "a 64×64 rectangle's sum, with tile sums", u16, "ms",
         primitive("region_sum_64x64_with_tile_sums")),
    ]


def dense_peer_rows():
    """bench-kernels: bench_dense_peers' host time per product."""
    names = [("bf", "BF"), ("abf", "ABF"), ("adf", "ADF"), ("annulus", "annulus shape"),
             ("bf-scan-bin-2", "BF scan_bin 2"), ("comx", "CoMx (computed plan)"), ("comy", "CoMy (computed plan)"),
             ("bf-fresh-crop", "BF fresh plan (new crop)"), ("comx-fresh-crop", "CoMx fresh plan (new crop)"),
             ("cbed-new-position", "cbed new position"), ("cbed-region-mean-r5", "cbed-region mean r=5")]

    def read(name):
        return lambda r: (round(r["products"][name]["host_ms"], 3), f"kernel {r['products'][name]['kernel_ms']:.3f}")
    return [(rid, "dense-peers", name, "dense_peers", "ms", read(name)) for rid, name in names]


def codec_rows():
    """bench-codec: bench_gpu_codec on the 512² u16 volume and the 128×512 u32 one."""
    u16 = "codec_u16_512"
    return [
        ("bslz4-decode-512", "codec", "bitshuffle/LZ4 decode alone, 512² u16", u16, "ms",
         lambda r: (round(r["bslz4_decode"]["seconds_median"] * 1e3, 1),
                    f"{r['bslz4_decode']['decoded_GBps']:.0f} GB/s decoded")),
        ("ans-encode", "codec", "ANS encode, measure + write", u16, "GB/s",
         lambda r: (round(r["ans_encode"]["dense_GBps"]), "of dense input")),
        ("ans-decode", "codec", "ANS full decode to dense u16", u16, "GB/s",
         lambda r: (round(r["ans_decode"]["dense_GBps"]), "written")),
        ("ans-decode-u32", "codec", "ANS full decode, 128×512 u32 dense preset", "codec_u32_128x512", "ms",
         lambda r: (round(r["ans_decode"]["seconds_median"] * 1e3, 1), f"{r['ans_decode']['dense_GBps']:.0f} GB/s")),
        ("masked-sum-vs-dense", "codec", "BF masked sum from the ANS resident ÷ the same mask over the volume dense",
         u16, "", lambda r: (round(r["masked_sum"]["ans_over_dense"], 2),
                             f"{r['masked_sum']['ans_ms_median']:.3f} against {r['masked_sum']['dense_ms_median']:.3f} ms")),
        ("masked-sum-g1024", "codec", "BF masked sum from the ANS resident, 1024 frames per group",
         "codec_u16_512_g1024", "ms", lambda r: (round(r["masked_sum"]["ans_ms_median"], 3), None)),
    ]


def kernel_ms(prefix):
    def read(r):
        key = next(k for k in r if k.startswith(prefix))
        return round(r[key]["ms_per_load"], 1), None
    return read


def profile_rows():
    """profile: ncu's kernel time per 512² load (ncu_kernel_table.py)."""
    kernels = [("decode-blocks", "decode_blocks_kernel"), ("symbol-counts", "symbol_counts_kernel"),
               ("row-ring-sums", "row_ring_sums_kernel"), ("pixel-sums", "pixel_sums_kernel")]
    specs = [(rid, "load-kernels", f"`{name}`", "load_kernels", "ms", kernel_ms(name)) for rid, name in kernels]
    specs.append(("kernels-total", "load-kernels", "every kernel of one load", "load_kernels", "ms",
                  lambda r: (r["_total_ms_per_load"], None)))
    return specs


def admission_rows():
    return [
        ("peaks-1024", "admission", "1024×1024×192×192 u16 realistic: largest reservation ÷ measured peak",
         "load_u16_1024", "", peaks),
        ("refusal-413-http", "admission", "413 for a load above every budget, through HTTP (512² under 2 GB)",
         "refusal_413", "ms", lambda r: (round(r["p50_ms"], 2), "p50 at the client")),
    ]


def soak_rows():
    return [("soak-cycles", "soak", "load/evict cycles through HTTP, 512² u16", "soak_cycles", "failures",
             lambda r: (r["failures"], f"{r['cycles']} cycles, median cycle {r['cycle_seconds_median']:.3f} s"))]


def catalog_rows():
    """catalog: bench_catalog.py over 20,000 acquisitions, one inspector worker per core."""
    step = "catalog_workers_0"
    seconds = lambda key: lambda r: (round(r[key], 2), None)
    return [
        ("first-build", "catalog", "first build → `/api/health/ready`", step, "s",
         lambda r: (round(r["first_build_to_ready_s"], 2), f"{r['cores']} inspector workers")),
        ("restart", "catalog", "restart, nothing changed → ready", step, "s", seconds("restart_unchanged_to_ready_s")),
        ("refresh", "catalog", "`sessions?refresh=true`, nothing changed", step, "s", seconds("refresh_unchanged_s")),
        ("new-acquisition", "catalog", "one new acquisition listed by `/acquisitions`", step, "s",
         seconds("new_acquisition_listed_by_acquisitions_s")),
        ("poll-304", "catalog", "304 poll of an unchanged catalog, median", step, "ms",
         lambda r: (round(r["poll_304_median_s"] * 1e3, 2), None)),
        ("rss", "catalog", "daemon RSS after the first build / after a restart", step, "MB",
         lambda r: (f"{r['rss_bytes'] / 1e6:.0f} / {r['restart_rss_bytes'] / 1e6:.0f}", None)),
    ]


def export_row(name):
    """An export_bench.py row: seconds, with the stages, the encoder and the write floor beside it."""
    def read(r):
        row = next(x for x in r["rows"] if x["name"] == name and "error" not in x)
        stages = row["result"].get("seconds", {})
        detail = (f"{row['result'].get('encoder')} encoder; write {stages.get('write', 0):.2f} s, encode "
                  f"{stages.get('encode', 0):.2f} s (summed); {row['result'].get('output_bytes', 0) / 1e9:.2f} GB; "
                  f"write floor {row['write_floor_seconds']:.2f} s")
        return round(row["seconds"], 3), detail
    return read


def export_rows():
    """bench-export: export_bench.py through the export route and the CLI, each beside its write floor."""
    return [
        ("full-http", "export", "512² u16, full, no bin, resident: HTTP job POST → done", "export_resident", "s",
         export_row("full_512_u16")),
        ("full-cli", "export", "the same by the CLI, process start → done", "export_cli", "s",
         export_row("full_512_u16_cli")),
        ("det-bin-2", "export", "detector bin 2 of the 512² acquisition (uint32 out)", "export_resident", "s",
         export_row("detbin2_512_u16")),
        ("crop-1024", "export", "256×256 scan crop of a 1024×1024 u16 source", "export_large", "s",
         export_row("crop256_1024_u16")),
        ("scan-bin-2-crop", "export", "scan bin 2 of a 256×256 crop", "export_resident", "s",
         export_row("scanbin2_crop256_512_u16")),
        ("full-http-host-encoder", "export", "512² u16 full with the host encoder (the baseline, same run)",
         "export_host_encoder", "s", export_row("full_512_u16_host_encoder")),
    ]


SUITES = {"bench-export": export_rows, "bench-http": http_rows, "bench-load": load_rows, "bench-kernels": dense_peer_rows,
          "bench-codec": codec_rows, "profile": profile_rows, "admission": admission_rows, "soak": soak_rows,
          "catalog": catalog_rows}


def rows_of_report(report):
    """The result rows a suite report measures (empty for suites without benchmark rows)."""
    specs = SUITES.get(report.get("suite"), lambda: [])()
    results = {step["name"]: step.get("result") for step in report.get("steps", []) if step.get("passed")}
    commit, date = (report.get("commit") or "")[:7] or None, (report.get("date") or "")[:10] or None
    command = f"scripts/device/run.sh build {report['suite']}" if specs else None
    rows = []
    for rid, area, what, step, unit, read in specs:
        try:
            figure, detail = read(results[step])
        except (KeyError, TypeError, AttributeError, StopIteration, ZeroDivisionError, ValueError):
            continue  # not measured in this run: the row keeps its last figure
        rows.append({"id": rid, "area": area, "what": what, "figure": figure, "unit": unit, "detail": detail,
                     "commit": commit, "date": date,
                     "command": ("QUANTEM_LARGE=1 " if rid == "load-1024-u16" else "") + command})
    return rows

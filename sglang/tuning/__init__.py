"""`python -m sglang.tune`: sweep server configurations against one workload and recommend a launch command.

Split by concern:
- `grid`: `--grid name=v1,v2` specs -> the configurations (server flags and environment variables);
- `server`: one server per configuration (start, /health, process-tree memory peak, clean stop);
- `workload`: the benchmark of one run (bench_serving in-process, or a `--trace` replay via `trace`);
- `store`: the resumable JSONL results file;
- `report`: the ranked table, SLO filtering, the Pareto front, the recommended command (`plot`: its PNG);
- `sweep`: the loop tying them together; `cli`: the flags.

The guide is docs/tuning.md.
"""

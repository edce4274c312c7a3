"""Where each rank's memory goes: the allocator's ``[memory]`` events of a trace and PyTorch's
memory snapshots, read into small tables (docs/memory.md, docs/metrics.md "Memory").

- ``series``    — allocated and reserved over time, per device of a rank (totals rebuilt from
                  the signed ``Bytes`` where a trace has none: PyTorch 1.8);
- ``steps``     — per profiled step: peaks, where they fall, reserved − allocated, growth;
- ``operators`` — the operator and module a memory event happened in;
- ``live``      — the allocations live at a moment, grouped by what made them;
- ``curve``     — a bounded copy of the series for the report and its pages;
- ``terms``     — model states measured from the trace (gradients, optimizer state) and the
                  runner's own count of them;
- ``snapshot``  — ``torch.cuda.memory._dump_snapshot`` files, read without running code;
- ``rank_memory`` — the per-rank entry: one trace in, its memory tables out.
"""

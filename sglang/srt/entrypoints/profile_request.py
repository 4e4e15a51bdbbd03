"""The body of `/start_profile` (upstream's `ProfileReqInput` fields) -> the `ProfileReq` every scheduler
rank gets. Fields this engine cannot honour get a 400 naming them instead of being ignored."""

from __future__ import annotations

import time
from typing import Any

from sglang.srt.errors import GenerateError
from sglang.srt.managers.io_struct import ProfileReq
from sglang.srt.managers.profiler import ACTIVITIES, profile_steps, trace_dir

# accepted only at their default: the behaviour they select is not built here
_DEFAULT_ONLY = {"start_step": None, "profile_by_stage": False, "merge_profiles": False}
_KNOWN = {"output_dir", "num_steps", "activities", "with_stack", "record_shapes", *_DEFAULT_ONLY}


def start_profile_request(data: dict[str, Any]) -> ProfileReq:
    unknown = sorted(set(data) - _KNOWN)
    if unknown:
        raise GenerateError(f"unknown /start_profile field(s): {', '.join(unknown)}; known: {', '.join(sorted(_KNOWN))}")
    for name, default in _DEFAULT_ONLY.items():
        if data.get(name) not in (None, default):
            raise GenerateError(f"{name}={data[name]!r} is not supported by /start_profile here")
    output_dir = data.get("output_dir")
    if output_dir is not None and (not isinstance(output_dir, str) or not output_dir):
        raise GenerateError(f"output_dir must be a non-empty directory path, got {output_dir!r}")
    num_steps = data.get("num_steps")
    if num_steps is not None and (not isinstance(num_steps, int) or isinstance(num_steps, bool) or num_steps < 1):
        raise GenerateError(f"num_steps must be a positive integer, got {num_steps!r}")
    try:  # refused here, before any scheduler makes a directory or starts recording
        output_dir, num_steps = trace_dir(output_dir), profile_steps(num_steps)
    except ValueError as e:
        raise GenerateError(str(e)) from None
    activities = data.get("activities")
    if activities is None:
        activities = list(ACTIVITIES)
    if not isinstance(activities, list) or not activities or not all(isinstance(a, str) for a in activities):
        raise GenerateError(f"activities must be a non-empty list of {list(ACTIVITIES)}, got {activities!r}")
    bad = sorted(set(activities) - set(ACTIVITIES))
    if bad:
        raise GenerateError(f"unsupported profiler activities {bad}: this server records {list(ACTIVITIES)}")
    flags = {}
    for name in ("with_stack", "record_shapes"):
        value = data.get(name)
        if value is not None and not isinstance(value, bool):
            raise GenerateError(f"{name} must be true or false, got {value!r}")
        flags[name] = bool(value)
    return ProfileReq("start", output_dir=output_dir, num_steps=num_steps, activities=activities,
                      profile_id=str(time.time()), **flags)

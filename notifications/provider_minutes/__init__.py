"""Provider health's last hour (issue 27 part 2; docs/OPERATIONS.md, "Provider health page"): beat's
per-minute rollup of provider calls and breaker states (:mod:`.sampler`) and what the page draws
from it (:mod:`.last_hour`)."""

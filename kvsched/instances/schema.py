"""The pydantic schema of a JSON instance file (:mod:`kvsched.instances.io` reads files through it).

Kept apart so that a command that loads a CSV trace, or builds its limits from
flags, never imports pydantic or builds these models (about 0.1 s of start-up):
:mod:`kvsched.instances.io` imports this module where it validates a document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from kvsched.instances.io import INSTANCE_KIND, MAX_TIME, MAX_TOKENS

#: Strict types: JSON ``true`` is not 1, ``8.0`` is not a token count, ``"8"`` is not a number.
Tokens = Annotated[int, Field(strict=True, gt=0, le=MAX_TOKENS)]
Time = Annotated[float, Field(strict=True, ge=0, le=MAX_TIME, allow_inf_nan=False)]
Slo = Annotated[float, Field(strict=True, gt=0, le=MAX_TIME, allow_inf_nan=False)]
Param = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestSchema(_Strict):
    id: str = Field(min_length=1, strict=True)
    arrival: Time
    prompt: Tokens = Field(description="prompt tokens I")
    output: Tokens = Field(description="output tokens O, counting the last (never processed) token")
    predicted_output: Tokens | None = None
    cls: str | None = Field(default=None, strict=True)
    priority: int = Field(default=0, strict=True, ge=-MAX_TOKENS, le=MAX_TOKENS)
    ttft_slo: Slo | None = None
    tbt_slo: Slo | None = None


class LimitsSchema(_Strict):
    kv_capacity: Tokens = Field(description="KV capacity M in tokens")
    block_size: Tokens = 1
    max_batch_tokens: Tokens | None = None
    max_prefill_tokens: Tokens | None = None
    max_running: Tokens | None = None

    @model_validator(mode="after")
    def _blocks_fit(self) -> LimitsSchema:
        if self.block_size > self.kv_capacity:
            raise ValueError(f"block_size {self.block_size} is larger than kv_capacity {self.kv_capacity}")
        return self


class TimeModelSchema(_Strict):
    name: str = Field(default="unit", strict=True)
    params: dict[str, Param] = Field(default_factory=dict)


class InstanceSchema(_Strict):
    schema_version: Literal[1]
    kind: Literal["kvsched.instance"] = INSTANCE_KIND
    name: str = Field(default="", strict=True)
    limits: LimitsSchema
    time_model: TimeModelSchema = Field(default_factory=TimeModelSchema)
    requests: list[RequestSchema] = Field(min_length=1)
    meta: dict[str, Any] = Field(default_factory=dict)

    @field_validator("requests")
    @classmethod
    def _unique_ids(cls, value: list[RequestSchema]) -> list[RequestSchema]:
        seen: set[str] = set()
        for r in value:
            if r.id in seen:
                raise ValueError(f"duplicate request id {r.id!r}")
            seen.add(r.id)
        return value

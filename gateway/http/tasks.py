"""The shapes of the task APIs' answers (vLLM's, SGLang's and Dynamo's classification),
rendered from gateway.serving.tasks' rows: shared by ``/v1/classify`` and the vLLM body
of ``/classify``."""

from __future__ import annotations

import time
from typing import Literal

from fastapi.responses import Response
from pydantic import BaseModel, Field

from gateway import jsoncodec
from gateway.serving.call import Answer
from gateway.serving.tasks import ClassRow


class ClassData(BaseModel):
    index: int
    label: str = Field(description="The top class.")
    probs: list[float] = Field(description="Every class's score, in the model's label order.")
    num_classes: int


class Usage(BaseModel):
    prompt_tokens: int = Field(0, description="Always 0: the tokenizer runs in Triton.")
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: None = None


class ClassifyTaskResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassData]
    usage: Usage


def task_response(request_id: str, answer: Answer, rows: list[ClassRow]) -> Response:
    task = ClassifyTaskResponse(
        id=f"classify-{request_id}",
        created=int(time.time()),
        model=answer.model,
        data=[
            ClassData(index=i, label=row.label, probs=row.probs, num_classes=len(row.probs))
            for i, row in enumerate(rows)
        ],
        usage=Usage(),
    )
    return Response(jsoncodec.dumps(task.model_dump()), media_type="application/json")

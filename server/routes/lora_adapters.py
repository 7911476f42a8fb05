"""POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name}:
vLLM's routes for adapters loaded while serving, with vLLM's bodies and plain-text success
replies. Served only with --enable-lora-runtime-updates (or vLLM's
VLLM_ALLOW_RUNTIME_LORA_UPDATING), as vLLM serves them only then: elsewhere they are 404s.

An adapter (a PEFT folder, or a GGUF LoRA file) goes to the default model's engine, between
two of its steps, and is read and checked whole before it is attached: a bad folder or a rank
over --max-lora-rank is a 400 and leaves nothing half loaded."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict

from engine import envs
from engine.lora import LoraError
from server.api.errors import APIError
from server.runtime.engine_client import EngineClient
from server.runtime.state import ServerState, State

router = APIRouter()


class LoadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's load_inplace and the like: not needed here
    lora_name: str
    lora_path: str


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str
    lora_int_id: int | None = None


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(body: LoadLoraAdapter, state: State) -> str:
    engine = updatable_engine(state)
    if state.registry.find(body.lora_name) is not None and body.lora_name not in engine.lora_adapters():
        raise APIError(400, f"`{body.lora_name}` is the name of a served model", "lora_name")
    if body.lora_name in engine.lora_adapters():
        raise APIError(400, f"The lora adapter '{body.lora_name}' has already been loaded.", "lora_name")
    try:
        await engine.load_lora_adapter(body.lora_name, body.lora_path)
    except LoraError as err:
        raise APIError(400, str(err), "lora_path") from err
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(body: UnloadLoraAdapter, state: State) -> str:
    engine = updatable_engine(state)
    if body.lora_name not in engine.lora_adapters():
        raise APIError(404, f"The lora adapter '{body.lora_name}' cannot be found.", "lora_name")
    try:
        await engine.unload_lora_adapter(body.lora_name)
    except LoraError as err:  # requests still run on it
        raise APIError(409, str(err), "lora_name") from err
    return f"Success: LoRA adapter '{body.lora_name}' removed successfully."


def updatable_engine(state: ServerState) -> EngineClient:
    """The default model's engine, when run-time updates are on and it serves adapters."""
    if not (state.settings.enable_lora_runtime_updates or envs.ALLOW_RUNTIME_LORA_UPDATING.get()):
        raise APIError(404, "Not Found: start the server with --enable-lora-runtime-updates "
                            "(or VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) to load adapters while serving")
    engine = state.require_engine()
    if not engine.config.enable_lora:
        raise APIError(400, "This model serves no adapters: start it with --enable-lora", "lora_name")
    return engine

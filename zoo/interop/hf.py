"""xlstm-zoo models as transformers models: ``AutoConfig`` / ``AutoModelForCausalLM`` for ``model_type
xlstm_zoo``, and ``generate()`` on the recurrent state.

- :class:`XlstmZooConfig` holds the recipe (``config.json``, :mod:`xlstm_zoo.model_files.files`);
- :class:`XlstmZooForCausalLM` wraps the zoo ``causal_lm`` (``.zoo``); ``from_pretrained`` reads a zoo
  model directory through the zoo's own strict loader (:mod:`xlstm_zoo.pretrained`), ``save_pretrained``
  writes one (recipe.yaml, model.safetensors, config.json, model card);
- :class:`RecurrentCache` is ``generate()``'s cache: the zoo state, fixed in size. The prompt is read in
  one parallel pass, then each new token is one recurrent :meth:`~xlstm_zoo.models.lm.CausalLM.step`,
  exactly as the zoo's own ``generate``; beam search selects state rows by beam (``reorder_cache``).

Batches padded on the left (``generate`` with a padding tokenizer) start each row from the zero state
at its first real token (``doc_starts``), so padding changes nothing; padding on the right only leaves
padded positions' logits unused. Imported only once transformers is (:func:`xlstm_zoo.interop.install`).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedConfig, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from xlstm_zoo.errors import ConfigError, InputError
from xlstm_zoo.model_files import files
from xlstm_zoo.pretrained import Plan, save_pretrained as zoo_save_pretrained
from xlstm_zoo.pretrained.load import load_into
from xlstm_zoo.pretrained.sources import open_checkpoint
from xlstm_zoo.recipe_loader import build
from xlstm_zoo.tasks.tokenizer import saved_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@strict(accept_kwargs=True)
class XlstmZooConfig(PreTrainedConfig):
    """The recipe of a zoo causal LM (``recipe``), which xlstm-zoo wrote it (``xlstm_zoo``) and the
    transformers names of its sizes (informative: the recipe decides)."""

    model_type = files.MODEL_TYPE

    recipe: dict | None = None
    xlstm_zoo: dict | None = None
    vocab_size: int | None = None
    hidden_size: int | None = None
    num_hidden_layers: int | None = None
    tie_word_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    max_position_embeddings: int | None = None  # the smallest attention cache (max_cache), where there is one
    use_cache: bool = True

    def zoo_recipe(self, where: str = "config"):
        """The recipe, validated: an invalid field, a missing plugin or a newer format is one line naming it."""
        files.check_written_by(self.xlstm_zoo, where)
        return files.model_recipe(self.recipe, self.xlstm_zoo, where)


class RecurrentCache:
    """The zoo model's recurrent state as ``generate()``'s cache: one fixed-size state per block (no keys
    and values; an attention block's fixed cache is part of its state). ``seen``: tokens read so far."""

    is_compileable = False
    is_croppable = False

    def __init__(self, state, seen: int):
        self.state, self.seen = state, seen

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Keep, for each row, the state of the beam ``beam_idx`` names (beam search)."""
        self.state = _rows(self.state, beam_idx)


def _rows(state, index):
    if isinstance(state, torch.Tensor):
        return state.index_select(0, index.to(state.device))
    if isinstance(state, tuple) and hasattr(state, "_fields"):  # a NamedTuple state
        return type(state)(*(_rows(s, index) for s in state))
    if isinstance(state, (tuple, list)):
        return type(state)(_rows(s, index) for s in state)
    return state  # None: a block without state


class XlstmZooForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = XlstmZooConfig
    base_model_prefix = "zoo"
    main_input_name = "input_ids"
    _is_stateful = True  # transformers: no assisted generation (the state cannot be rolled back)

    def __init__(self, config: XlstmZooConfig, zoo_model: torch.nn.Module | None = None):
        super().__init__(config)
        self.zoo = zoo_model if zoo_model is not None else build(config.zoo_recipe())
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its RecurrentCache on the first forward

    def _init_weights(self, module) -> None:
        pass  # the zoo's initializer ran when the model was built; from_pretrained reads every weight

    def get_input_embeddings(self):
        return self.zoo.embedding

    def get_output_embeddings(self):
        return self.zoo.head

    def forward(self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
                past_key_values: RecurrentCache | None = None, labels: torch.LongTensor | None = None,
                use_cache: bool | None = None, inputs_embeds: torch.Tensor | None = None,
                return_dict: bool | None = None, **kwargs) -> CausalLMOutputWithPast:
        """``input_ids [B, T]`` -> ``logits [B, T, vocab]``; with ``past_key_values`` (a :class:`RecurrentCache`)
        the tokens continue its state (one token: one recurrent step). ``labels``: mean next-token loss."""
        if inputs_embeds is not None or input_ids is None:
            raise InputError("xlstm-zoo models take input_ids (token ids), not inputs_embeds")
        state = past_key_values.state if past_key_values is not None else None
        if state is not None and input_ids.shape[1] == 1:
            logits, state = self.zoo.step(input_ids[:, 0], state)
            logits = logits[:, None]
        else:
            starts = _padding_starts(attention_mask) if state is None else None
            logits, state = self.zoo(input_ids, state, doc_starts=starts)
        cache = None
        if use_cache if use_cache is not None else self.config.use_cache:
            cache = past_key_values or RecurrentCache(None, 0)
            cache.state, cache.seen = state, cache.seen + input_ids.shape[1]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten().to(logits.device),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, past_key_values=cache)

    # -- files ----------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config: XlstmZooConfig | None = None,
                        dtype=None, torch_dtype=None, device_map=None, **kwargs) -> "XlstmZooForCausalLM":
        """A zoo model directory (``save_pretrained(layout="zoo")`` or a run's ``checkpoint/``), read by the
        zoo's strict loader. ``dtype``: the weights' dtype ("auto"/None: as saved); ``device_map``: one
        device. Other transformers loading options (quantization, sharding over devices, the hub) are refused."""
        directory = Path(pretrained_model_name_or_path)
        if not directory.is_dir():
            raise ConfigError("not a local directory: xlstm-zoo models load from a model directory (download one "
                              "from the hub first, e.g. with huggingface_hub.snapshot_download)", file=str(directory))
        unsupported = sorted(k for k, v in kwargs.items() if v is not None and k not in _IGNORED and
                             not (k == "low_cpu_mem_usage" and v))
        if model_args or unsupported:
            raise ConfigError(f"from_pretrained options not supported for xlstm-zoo models: "
                              f"{', '.join(unsupported) or 'positional arguments'} (supported: config, dtype, "
                              "device_map with one device)", file=str(directory))
        where = str(directory / files.CONFIG)
        if config is None:
            config = XlstmZooConfig.from_dict(files.read_config(directory))
        recipe = config.zoo_recipe(where)
        plan = Plan(open_checkpoint(directory, layout="zoo"), recipe.model_dump())
        zoo = load_into(plan.model, plan.rules, plan.opened.source, dtype=_dtype(dtype or torch_dtype, where),
                        device=_device(device_map, where), what="xlstm-zoo model directory")
        saved_tokenizer(directory, vocab_size=zoo.embedding.num_embeddings)  # a tokenizer of another model: refused
        zoo.recipe = recipe
        config.name_or_path = str(directory)
        model = cls(config, zoo)
        return model.eval()

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        """A zoo model directory (what :func:`xlstm_zoo.save_pretrained` writes with ``layout="zoo"``)."""
        zoo_save_pretrained(self.zoo, save_directory, layout="zoo", recipe=getattr(self.zoo, "recipe", None))


# transformers passes these on its own (hub, cache and loading-speed options): meaningless for a local zoo
# directory read tensor by tensor
_IGNORED = {"trust_remote_code", "revision", "cache_dir", "force_download", "local_files_only", "token", "proxies",
            "subfolder", "_from_auto", "_commit_hash", "code_revision", "attn_implementation", "adapter_kwargs",
            "use_safetensors", "_from_pipeline", "key_mapping"}


def _padding_starts(mask: torch.Tensor | None) -> torch.Tensor | None:
    """``doc_starts`` for a left-padded batch (each row restarts at its first real token); None without padding."""
    if mask is None or bool(mask.all()):
        return None
    mask = mask.bool()
    rise = mask[:, 1:].int() - mask[:, :-1].int()
    if not bool(((rise >= 0).all(1) | (rise <= 0).all(1)).all()):
        raise InputError("attention_mask must pad on the left or on the right only (no holes): a recurrent "
                         "model reads every token of a row in order")
    return mask & (mask.long().cumsum(1) == 1)


def _dtype(value, where: str) -> torch.dtype | None:
    if value is None or value == "auto" or isinstance(value, torch.dtype):
        return None if value in (None, "auto") else value
    if value not in DTYPES:
        raise ConfigError(f"dtype {value!r} (allowed: auto, {', '.join(DTYPES)} or a torch.dtype)", file=where)
    return DTYPES[value]


def _device(device_map, where: str) -> torch.device:
    if device_map is None:
        return torch.device("cpu")
    if isinstance(device_map, dict) and set(device_map) == {""}:
        device_map = device_map[""]
    if isinstance(device_map, (str, int, torch.device)) and device_map != "auto":
        return torch.device(device_map)
    raise ConfigError(f"device_map {device_map!r}: an xlstm-zoo model loads onto one device (e.g. 'cpu', 'cuda:0')",
                      file=where)


def register() -> None:
    """``AutoConfig`` and ``AutoModelForCausalLM`` learn ``model_type: xlstm_zoo``."""
    AutoConfig.register(files.MODEL_TYPE, XlstmZooConfig, exist_ok=True)
    AutoModelForCausalLM.register(XlstmZooConfig, XlstmZooForCausalLM, exist_ok=True)


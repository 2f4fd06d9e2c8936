"""Hugging Face ``transformers`` models built from configs with random weights (never the hub)."""
from __future__ import annotations

import importlib
from typing import Any

from opbench.exceptions import OpBenchError

# name -> (module family, config class, model class, input kind, full-size overrides, tiny overrides)
HF_MODELS: dict[str, tuple[str, str, str, str, dict[str, Any], dict[str, Any]]] = {
    "bert-base": ("bert", "BertConfig", "BertModel", "tokens", {},
                  {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128}),
    "roberta-base": ("roberta", "RobertaConfig", "RobertaModel", "tokens", {},
                     {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                      "intermediate_size": 128}),
    # without a key-value cache: the cache's concatenations are what Relax could not convert
    "gpt2": ("gpt2", "GPT2Config", "GPT2Model", "tokens", {"use_cache": False},
             {"n_layer": 2, "n_embd": 64, "n_head": 2, "use_cache": False}),
    "vit-base": ("vit", "ViTConfig", "ViTModel", "image", {},
                 {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 128,
                  "image_size": 32, "patch_size": 8}),
    "resnet-50": ("resnet", "ResNetConfig", "ResNetModel", "image", {},
                  {"depths": [1, 1], "hidden_sizes": [16, 32], "embedding_size": 16, "layer_type": "basic",
                   "image_size": 32}),
    **{f"resnet-{depth}": ("resnet", "ResNetConfig", "ResNetModel", "image",
                           {"depths": depths, "layer_type": kind, "hidden_sizes": widths},
                           {"depths": [1, 1], "hidden_sizes": [w // (4 if kind == "basic" else 8) for w in widths[:2]],
                            "embedding_size": 16, "layer_type": kind, "image_size": 32})
       for depth, depths, kind, widths in (  # He et al. 2016, table 1: basic blocks to 34 layers, bottlenecks beyond
           (18, [2, 2, 2, 2], "basic", [64, 128, 256, 512]), (34, [3, 4, 6, 3], "basic", [64, 128, 256, 512]),
           (101, [3, 4, 23, 3], "bottleneck", [256, 512, 1024, 2048]),
           (152, [3, 8, 36, 3], "bottleneck", [256, 512, 1024, 2048]))},
    "mobilenet-v2": ("mobilenet_v2", "MobileNetV2Config", "MobileNetV2Model", "image", {},
                     {"depth_multiplier": 0.35, "image_size": 32}),
    "convnext-tiny": ("convnext", "ConvNextConfig", "ConvNextModel", "image", {},
                      {"depths": [1, 1], "hidden_sizes": [16, 32], "num_stages": 2, "image_size": 32}),
}


TINY_MAX_SEQ_LEN = 16  # a tiny token model's sequences are cut to this length


def has_tokens(name: str) -> bool:
    """Whether the model reads token ids (and an attention mask) of a sequence length, known without building it."""
    return HF_MODELS[name][3] == "tokens"


def hf_module(name: str) -> str:
    """The ``transformers`` module that defines the model class of ``name`` (importing it takes seconds)."""
    family = HF_MODELS[name][0]
    return f"transformers.models.{family}.modeling_{family}"


def build_hf(name: str, tiny: bool, batch: int, seq_len: int) -> tuple[Any, tuple[Any, ...]]:
    """The model (returning its first output tensor, so torch.export sees a plain tensor) and inputs."""
    try:
        import transformers
    except ImportError as exc:
        raise OpBenchError(f"model '{name}' needs the 'transformers' package: pip install transformers") from exc
    import torch

    _, config_cls, model_cls, inputs, full, small = HF_MODELS[name]
    config = getattr(transformers, config_cls)(**(small if tiny else full))
    config._attn_implementation = "eager"  # plain matmul/softmax attention, which Relax imports
    torch.manual_seed(0)
    model = getattr(importlib.import_module(hf_module(name)), model_cls)(config).eval()  # the module a zygote preloads

    class FirstOutput(torch.nn.Module):
        """Token models take their attention mask too: a sequence padded up to a bucket masks its padding."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, x: Any, mask: Any = None) -> Any:
            return self.model(x, attention_mask=mask, return_dict=False)[0]

    if inputs == "tokens":
        seq = min(seq_len, TINY_MAX_SEQ_LEN) if tiny else seq_len
        tokens = torch.randint(0, config.vocab_size, (batch, seq))
        return FirstOutput().eval(), (tokens, torch.ones_like(tokens))
    size = getattr(config, "image_size", 224)
    return FirstOutput().eval(), (torch.randn(batch, getattr(config, "num_channels", 3), size, size),)

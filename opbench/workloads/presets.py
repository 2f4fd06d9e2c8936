"""Named workloads taken from real layers of real models."""
from __future__ import annotations

from typing import NamedTuple


class Preset(NamedTuple):
    spec: str
    model: str  # the model the layer comes from ("" for synthetic shapes)
    layer: str


PRESETS: dict[str, Preset] = {
    "matmul-512": Preset("matmul:m=512,n=512,k=512", "", "square GEMM"),
    "matmul-1024": Preset("matmul:m=1024,n=1024,k=1024", "", "square GEMM"),
    "bert-base-ffn1": Preset("dense:m=128,n=3072,k=768", "bert-base", "FFN up-projection, seq 128"),
    "bert-base-ffn2": Preset("dense:m=128,n=768,k=3072", "bert-base", "FFN down-projection, seq 128"),
    "bert-base-ffn1-int8": Preset("dense:m=128,n=3072,k=768,dtype=int8", "bert-base",
                                  "FFN up-projection, seq 128, u8 x i8 into i32"),
    "bert-base-ffn1-bf16": Preset("dense:m=128,n=3072,k=768,dtype=bfloat16", "bert-base",
                                  "FFN up-projection, seq 128, bf16 products summed in fp32"),
    "bert-base-attn": Preset("batch_matmul:b=12,m=128,n=128,k=64", "bert-base", "attention scores Q.K^T, 12 heads"),
    "bert-base-softmax": Preset("softmax:m=1536,n=128", "bert-base", "attention softmax, 12 heads x 128 rows"),
    "bert-base-layernorm": Preset("layer_norm:m=128,n=768", "bert-base", "layer norm, seq 128"),
    "resnet50-c2": Preset("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1", "resnet-50", "conv2_x 3x3"),
    "resnet50-c2-int8": Preset("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,dtype=int8", "resnet-50",
                               "conv2_x 3x3, u8 x i8 into i32"),
    "resnet50-c2-bf16": Preset("conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,dtype=bfloat16", "resnet-50",
                               "conv2_x 3x3, bf16 products summed in fp32"),
    "resnet50-stem": Preset("conv2d:n=1,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3", "resnet-50",
                            "stem 7x7, stride 2, on the RGB image"),
    "resnet50-c5": Preset("conv2d:n=1,c=512,h=7,w=7,k=512,r=3,s=3,stride=1,pad=1", "resnet-50", "conv5_x 3x3"),
    "resnet50-pool": Preset("pool2d:n=1,c=64,h=112,w=112,r=3,s=3,stride=2,pad=1,kind=max", "resnet-50", "stem max-pool"),
    "resnet50-add-relu": Preset("add_relu:n=1,c=256,h=56,w=56", "resnet-50", "conv2_x residual add + relu"),
    "resnet3d18-c2": Preset("conv3d:n=1,c=64,d=8,h=28,w=28,k=64,t=3,r=3,s=3,stride=1,pad=1", "resnet3d-18",
                            "stage 1 3x3x3, 16-frame 112x112 clip"),
    "dcgan-up3": Preset("conv2d_transpose:n=1,c=256,h=8,w=8,k=128,r=4,s=4,stride=2,pad=1", "dcgan", "generator layer 3, 8x8 to 16x16"),
    "mobilenetv2-dw": Preset("depthwise_conv2d:n=1,c=144,h=56,w=56,r=3,s=3,stride=1,pad=1", "mobilenet-v2", "block 3 depthwise 3x3"),
}

"""The workloads a collection measures (``opbench dataset collect``, ``benchmarks/predictor_heldout.py --collect``):
real layers' shapes of every catalogue kind, grown where the predictor ranked worst. The held-out study scores
its predictors on DEVELOPMENT's folds and, once chosen, on FINAL, which is never scored while choosing."""
from __future__ import annotations

DEVELOPMENT = (
    "matmul-512", "matmul:m=256,n=256,k=256", "matmul:m=512,n=256,k=1024",
    "bert-base-ffn1", "bert-base-ffn2", "dense:m=128,n=768,k=768",
    "bert-base-attn", "batch_matmul:b=12,m=128,n=64,k=128",
    "resnet50-c2", "resnet50-c5", "conv2d:n=1,c=256,h=56,w=56,k=64,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=64,h=56,w=56,k=128,r=3,s=3,stride=2,pad=1",
    "mobilenetv2-dw", "depthwise_conv2d:n=1,c=32,h=112,w=112,r=3,s=3,stride=1,pad=1",
    # more data (issue 41's idea): ResNet-50's and MobileNetV2's other layer shapes, and more GEMM shapes
    "conv2d:n=1,c=128,h=28,w=28,k=128,r=3,s=3,stride=1,pad=1", "conv2d:n=1,c=256,h=14,w=14,k=256,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=128,h=56,w=56,k=128,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=256,h=56,w=56,k=512,r=1,s=1,stride=2,pad=0",
    "depthwise_conv2d:n=1,c=192,h=28,w=28,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=384,h=14,w=14,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=144,h=56,w=56,r=3,s=3,stride=2,pad=1",
    "dense:m=32,n=3072,k=768", "matmul:m=128,n=1024,k=512", "batch_matmul:b=8,m=64,n=64,k=256",
    "conv2d:n=1,c=1024,h=14,w=14,k=256,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=32,h=112,w=112,k=64,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=512,h=28,w=28,k=1024,r=1,s=1,stride=2,pad=0", "depthwise_conv2d:n=1,c=576,h=14,w=14,r=3,s=3,stride=1,pad=1",
    "dense:m=1,n=4096,k=1024", "matmul:m=1024,n=256,k=256",
    # more data again: the kinds scored lowest (depthwise, 1x1 and small convolutions), more GEMM shapes
    "depthwise_conv2d:n=1,c=64,h=56,w=56,r=3,s=3,stride=1,pad=1", "depthwise_conv2d:n=1,c=960,h=7,w=7,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=240,h=28,w=28,r=5,s=5,stride=1,pad=2", "depthwise_conv2d:n=1,c=32,h=56,w=56,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=288,h=28,w=28,r=3,s=3,stride=2,pad=1",
    "conv2d:n=1,c=96,h=28,w=28,k=32,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=576,h=14,w=14,k=96,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=320,h=7,w=7,k=1280,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=64,h=28,w=28,k=96,r=3,s=3,stride=1,pad=1", "conv2d:n=1,c=256,h=7,w=7,k=512,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=16,h=56,w=56,k=32,r=3,s=3,stride=2,pad=1",
    "dense:m=64,n=768,k=3072", "dense:m=8,n=512,k=512", "matmul:m=64,n=2048,k=256", "matmul:m=256,n=512,k=64",
    "batch_matmul:b=4,m=256,n=32,k=64", "batch_matmul:b=16,m=32,n=128,k=32",
    "dense:m=4,n=1024,k=4096", "dense:m=128,n=256,k=1024", "dense:m=2,n=2048,k=512",
    "depthwise_conv2d:n=1,c=128,h=28,w=28,r=3,s=3,stride=1,pad=1", "depthwise_conv2d:n=1,c=512,h=14,w=14,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=672,h=14,w=14,r=5,s=5,stride=1,pad=2", "depthwise_conv2d:n=1,c=16,h=112,w=112,r=3,s=3,stride=2,pad=1",
    "conv2d:n=1,c=32,h=56,w=56,k=32,r=3,s=3,stride=1,pad=1", "conv2d:n=1,c=128,h=14,w=14,k=256,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=3,h=224,w=224,k=32,r=3,s=3,stride=2,pad=1", "matmul:m=512,n=128,k=2048", "matmul:m=200,n=300,k=400",
    # row-wise operators (softmax, layer norm): a model's fused row-wise operator had none of its kind to learn from
    "bert-base-softmax", "bert-base-layernorm", "softmax:m=4096,n=64", "softmax:m=256,n=1024",
    "layer_norm:m=512,n=1024", "layer_norm:m=64,n=384",
    # tiny row-wise operators (a few microseconds): a model's fused layer norm of 16-wide rows ranked below a random
    # pick, its configs ordered as a kernel this short orders them (parallel off wins), which no larger one taught
    "layer_norm:m=128,n=16", "layer_norm:m=32,n=128", "softmax:m=128,n=32", "softmax:m=16,n=256",
    # more data, a third time (2026-11-30): shapes of every kind from real models' layers (classifiers, attention,
    # MobileNet and EfficientNet blocks), weighted to the kinds the development set ranked worst (dense, row-wise)
    "matmul:m=96,n=512,k=512", "matmul:m=640,n=160,k=320", "matmul:m=1536,n=64,k=128", "matmul:m=48,n=48,k=1024",
    "dense:m=1,n=1000,k=1280", "dense:m=24,n=2048,k=512", "dense:m=48,n=1024,k=1024", "dense:m=12,n=3072,k=768",
    "dense:m=256,n=512,k=512", "dense:m=1,n=768,k=3072",
    "batch_matmul:b=12,m=64,n=128,k=64", "batch_matmul:b=2,m=256,n=256,k=64", "batch_matmul:b=32,m=16,n=16,k=64",
    "conv2d:n=1,c=48,h=28,w=28,k=48,r=3,s=3,stride=1,pad=1", "conv2d:n=1,c=160,h=14,w=14,k=160,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=24,h=112,w=112,k=24,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=32,h=112,w=112,k=16,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=160,h=7,w=7,k=960,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=384,h=14,w=14,k=64,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=128,h=28,w=28,k=512,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=24,h=56,w=56,k=144,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=512,h=14,w=14,k=512,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=128,h=56,w=56,k=256,r=1,s=1,stride=2,pad=0",
    "depthwise_conv2d:n=1,c=120,h=28,w=28,r=5,s=5,stride=1,pad=2", "depthwise_conv2d:n=1,c=384,h=28,w=28,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=240,h=14,w=14,r=5,s=5,stride=1,pad=2", "depthwise_conv2d:n=1,c=1152,h=7,w=7,r=3,s=3,stride=1,pad=1",
    "softmax:m=1024,n=128", "softmax:m=64,n=2048", "softmax:m=384,n=384",
    "layer_norm:m=256,n=768", "layer_norm:m=1024,n=256", "layer_norm:m=16,n=1024",
    # more data, a fourth time (trained on a half, three quarters and all of the others, the development workloads'
    # top-1 still rose with each): 30 more of every kind FINAL holds, most of them dense (the kind ranked worst)
    "dense:m=2,n=768,k=768", "dense:m=6,n=512,k=2048", "dense:m=16,n=768,k=3072", "dense:m=32,n=512,k=1024",
    "dense:m=8,n=2048,k=256", "dense:m=96,n=384,k=384", "dense:m=4,n=256,k=1024",
    "matmul:m=128,n=128,k=1024", "matmul:m=32,n=768,k=768", "matmul:m=320,n=320,k=320", "matmul:m=768,n=96,k=256",
    "batch_matmul:b=12,m=32,n=32,k=64", "batch_matmul:b=8,m=128,n=128,k=32", "batch_matmul:b=3,m=192,n=64,k=192",
    "conv2d:n=1,c=64,h=14,w=14,k=64,r=3,s=3,stride=1,pad=1", "conv2d:n=1,c=96,h=28,w=28,k=96,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=192,h=7,w=7,k=384,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=64,h=28,w=28,k=128,r=3,s=3,stride=2,pad=1", "conv2d:n=1,c=96,h=56,w=56,k=96,r=3,s=3,stride=2,pad=1",
    "conv2d:n=1,c=256,h=28,w=28,k=512,r=1,s=1,stride=2,pad=0",
    "conv2d:n=1,c=256,h=14,w=14,k=1024,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=64,h=28,w=28,k=384,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=1280,h=7,w=7,k=320,r=1,s=1,stride=1,pad=0", "conv2d:n=1,c=192,h=28,w=28,k=64,r=1,s=1,stride=1,pad=0",
    "depthwise_conv2d:n=1,c=64,h=28,w=28,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=256,h=14,w=14,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=480,h=14,w=14,r=5,s=5,stride=1,pad=2",
    "softmax:m=512,n=512", "softmax:m=2048,n=64", "softmax:m=96,n=1000",
    # more data, a fifth time: 46 more, weighted to the kinds the development set ranked worst (dense, matmul, softmax)
    "dense:m=16,n=1024,k=1024", "dense:m=16,n=4096,k=1024", "dense:m=24,n=768,k=3072", "dense:m=32,n=2048,k=2048",
    "dense:m=12,n=1536,k=1536", "dense:m=20,n=1280,k=640", "dense:m=64,n=1024,k=256", "dense:m=10,n=512,k=4096",
    "dense:m=3,n=1024,k=2048", "dense:m=40,n=640,k=2560", "dense:m=16,n=256,k=256", "dense:m=8,n=1536,k=768",
    "dense:m=28,n=384,k=1536", "dense:m=192,n=768,k=768", "dense:m=1,n=2048,k=2048", "dense:m=14,n=3072,k=256",
    "matmul:m=192,n=768,k=384", "matmul:m=512,n=64,k=512", "matmul:m=64,n=64,k=2048", "matmul:m=256,n=1024,k=128",
    "matmul:m=160,n=480,k=640", "matmul:m=768,n=768,k=64", "matmul:m=448,n=224,k=896", "matmul:m=96,n=192,k=1536",
    "batch_matmul:b=8,m=32,n=256,k=128", "batch_matmul:b=4,m=64,n=512,k=128", "batch_matmul:b=16,m=64,n=64,k=32",
    "batch_matmul:b=6,m=48,n=192,k=96", "softmax:m=1280,n=160", "softmax:m=48,n=4096", "softmax:m=192,n=768",
    "softmax:m=3072,n=32", "softmax:m=640,n=320", "softmax:m=32,n=1024",
    "conv2d:n=1,c=128,h=28,w=28,k=256,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=960,h=7,w=7,k=160,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=144,h=56,w=56,k=24,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=128,h=14,w=14,k=128,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=32,h=28,w=28,k=64,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=128,h=28,w=28,k=256,r=3,s=3,stride=2,pad=1",
    "conv2d:n=1,c=32,h=112,w=112,k=64,r=3,s=3,stride=2,pad=1",
    "conv2d:n=1,c=64,h=56,w=56,k=128,r=1,s=1,stride=2,pad=0",
    "depthwise_conv2d:n=1,c=192,h=56,w=56,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=48,h=56,w=56,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=320,h=14,w=14,r=3,s=3,stride=1,pad=1",
    "depthwise_conv2d:n=1,c=72,h=28,w=28,r=3,s=3,stride=2,pad=1",
    # 2x2 convolutions (2026-12-04): a transposed convolution runs in a model as one 2x2 convolution of its stacked
    # phases over its input padded by one, of which the collection had none (DCGAN's predicted 25-40% apart between
    # two runs' predictors); and 2x2 stride-2 patch convolutions (ConvNeXt's downsampling). Then the catalogue's own
    # transposed and 3-D convolutions, kinds it had no records of
    "conv2d:n=1,c=768,h=5,w=5,k=384,r=2,s=2,stride=1,pad=0", "conv2d:n=1,c=512,h=7,w=7,k=512,r=2,s=2,stride=1,pad=0",
    "conv2d:n=1,c=384,h=9,w=9,k=192,r=2,s=2,stride=1,pad=0", "conv2d:n=1,c=256,h=13,w=13,k=256,r=2,s=2,stride=1,pad=0",
    "conv2d:n=1,c=192,h=17,w=17,k=96,r=2,s=2,stride=1,pad=0", "conv2d:n=1,c=128,h=25,w=25,k=128,r=2,s=2,stride=1,pad=0",
    "conv2d:n=1,c=64,h=33,w=33,k=128,r=2,s=2,stride=1,pad=0", "conv2d:n=1,c=96,h=49,w=49,k=48,r=2,s=2,stride=1,pad=0",
    "conv2d:n=1,c=32,h=65,w=65,k=12,r=2,s=2,stride=1,pad=0", "conv2d:n=1,c=16,h=33,w=33,k=12,r=2,s=2,stride=1,pad=0",
    "conv2d:n=1,c=128,h=32,w=32,k=256,r=2,s=2,stride=2,pad=0", "conv2d:n=1,c=256,h=16,w=16,k=512,r=2,s=2,stride=2,pad=0",
    "conv2d_transpose:n=1,c=128,h=16,w=16,k=64,r=4,s=4,stride=2,pad=1",
    "conv2d_transpose:n=1,c=512,h=4,w=4,k=256,r=4,s=4,stride=2,pad=1",
    "conv3d:n=1,c=32,d=8,h=28,w=28,k=32,t=3,r=3,s=3,stride=1,pad=1",
    "conv3d:n=1,c=128,d=4,h=14,w=14,k=128,t=3,r=3,s=3,stride=1,pad=1",
)
FINAL = (  # scored only at the end: one of each kind
    "matmul:m=384,n=384,k=768", "dense:m=16,n=1000,k=2048", "conv2d:n=1,c=512,h=28,w=28,k=128,r=1,s=1,stride=1,pad=0",
    "conv2d:n=1,c=256,h=28,w=28,k=256,r=3,s=3,stride=2,pad=1",
    "depthwise_conv2d:n=1,c=96,h=56,w=56,r=3,s=3,stride=2,pad=1",
    # set aside later (2026-11-29), never scored before: a batch_matmul, a 3x3 convolution, a softmax
    "batch_matmul:b=6,m=96,n=96,k=128", "conv2d:n=1,c=96,h=14,w=14,k=192,r=3,s=3,stride=1,pad=1", "softmax:m=768,n=256",
)

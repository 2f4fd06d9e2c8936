"""Graph rewrites before fusion: a zero pad becomes its convolution's padding, a batch norm folds into the
convolution before it (else its tuple goes), and so each convolution fuses with its batch norm, activation and
residual add into one kernel."""
import numpy as np
import pytest

from opbench.workloads.models.sources import load_model


def _pad_conv(pad_width, pad_value=0.0, pad_mode="constant"):
    """A Relax module: pad (1, 3, 9, 9) then a stride-2 3x3 convolution without padding of its own."""
    from tvm import relax

    rng = np.random.default_rng(0)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 9, 9), "float32"))
    channels = 3 + pad_width[2] + pad_width[3]
    weight = relax.const(rng.standard_normal((4, channels, 3, 3)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            padded = bb.emit(relax.op.nn.pad(x, pad_width, pad_mode, pad_value))
            out = bb.emit_output(relax.op.nn.conv2d(padded, weight, strides=2))
        bb.emit_func_output(out)
    return bb.get()


def _run(mod, *data):
    import tvm
    from tvm import relax

    from opbench.hardware.targets import make_target

    vm = relax.VirtualMachine(tvm.compile(mod, make_target("llvm", 1)), tvm.cpu())
    return vm["main"](*map(tvm.runtime.tensor, data)).numpy()


def _calls(mod):
    from tvm import relax

    calls = []
    relax.analysis.post_order_visit(mod["main"], lambda e: calls.append(e) if isinstance(e, relax.Call)
                                    and hasattr(e.op, "name") else None)
    return calls


def _ops(mod):
    return [call.op.name for call in _calls(mod)]


@pytest.mark.parametrize("widths", [[0, 0, 0, 0, 0, 1, 0, 1], [0, 0, 0, 0, 1, 2, 2, 0]], ids=["same-strided", "uneven"])
def test_a_zero_pad_before_a_convolution_becomes_its_padding(widths):
    from opbench.workloads.models.graph import pad_into_conv

    mod = _pad_conv(widths)
    folded = pad_into_conv(mod)
    assert "relax.nn.pad" in _ops(mod) and _ops(folded) == ["relax.nn.conv2d"]  # the original is left as it was
    data = np.random.default_rng(1).standard_normal((1, 3, 9, 9)).astype("float32")
    np.testing.assert_allclose(_run(folded, data), _run(mod, data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pad", [{"pad_value": 1.0}, {"pad_mode": "reflect"}, {"pad_width": [0, 0, 1, 1, 1, 1, 1, 1]}],
                         ids=["nonzero", "reflect", "channels"])
def test_a_pad_the_convolution_cannot_take_stays(pad):
    from opbench.workloads.models.graph import pad_into_conv

    mod = _pad_conv(**{"pad_width": [0, 0, 0, 0, 1, 1, 1, 1], **pad})
    assert _ops(pad_into_conv(mod)) == _ops(mod) == ["relax.nn.pad", "relax.nn.conv2d"]


def _conv_batch_norm(constant_weight=True):
    """A Relax module: a 3x3 convolution (its weight a constant, or a parameter), then an inference batch norm of
    constant statistics, then ReLU."""
    from tvm import relax

    rng = np.random.default_rng(2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, 8, 8), "float32"))
    weights = rng.standard_normal((4, 3, 3, 3)).astype("float32")
    w = relax.const(weights) if constant_weight else relax.Var("w", relax.TensorType((4, 3, 3, 3), "float32"))
    gamma, beta, mean = (relax.const(rng.standard_normal(4).astype("float32")) for _ in range(3))
    var = relax.const(rng.uniform(0.5, 2.0, 4).astype("float32"))
    with bb.function("main", [x] if constant_weight else [x, w]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, padding=1))
            norm = bb.emit(relax.TupleGetItem(relax.op.nn.batch_norm(conv, gamma, beta, mean, var, axis=1,
                                                                            training=False), 0))
            out = bb.emit_output(relax.op.nn.relu(norm))
        bb.emit_func_output(out)
    return bb.get(), weights


def test_a_batch_norm_folds_into_the_convolution_before_it_as_a_scaled_weight_and_a_bias():
    """Its epilogue adds a bias where it subtracted, divided, multiplied and added per element; same result."""
    from opbench.workloads.models.graph import unwrap_batch_norm

    mod, _ = _conv_batch_norm()
    folded = unwrap_batch_norm(mod)
    assert _ops(folded) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    data = np.random.default_rng(3).standard_normal((1, 3, 8, 8)).astype("float32")
    np.testing.assert_allclose(_run(folded, data), _run(mod, data), rtol=1e-4, atol=1e-5)
    # a convolution whose weight is not a constant keeps its batch norm, decomposed into elementwise ops
    ops = _ops(unwrap_batch_norm(_conv_batch_norm(constant_weight=False)[0]))
    assert "relax.nn.batch_norm" not in ops and "relax.divide" in ops


@pytest.mark.full  # a whole model imported and built
def test_mobilenets_relu6_and_padding_fuse_into_its_convolutions():
    """Hugging Face's MobileNetV2 pads before each convolution (TF's "same") and a batch norm's tuple
    ended each fusion group: 66 fused operators, 110 calls, its ReLU6 and pads kernels of their own. With
    the pads folded and the tuples gone, every call is a convolution with its epilogue, and the model still
    matches PyTorch."""
    import tvm
    from tvm import relax

    from opbench.hardware.targets import make_target
    from opbench.workloads.models.extract import fuse, fused_ops, import_model

    source = load_model("mobilenet-v2@tiny")
    mod = fuse(import_model(source))
    ops = fused_ops(mod)[0]
    assert {op.kind for op in ops} == {"conv2d"}
    assert sum("clip" in op.name for op in ops) >= 10  # ReLU6 inside its convolution's kernel
    vm = relax.VirtualMachine(tvm.compile(mod, make_target("llvm", 1)), tvm.cpu())
    out = vm["main"](*(tvm.runtime.tensor(a) for a in source.numpy_inputs()))
    np.testing.assert_allclose(out.numpy(), source.reference()[0], rtol=1e-3, atol=1e-3)


def _conv(channels, dtype="float32"):
    """A Relax module: a 1x1 convolution of (1, 8, 5, 5) to ``channels`` by a constant weight, then a bias add."""
    from tvm import relax

    rng = np.random.default_rng(3)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 5, 5), dtype))
    weight = relax.const(rng.standard_normal((channels, 8, 1, 1)), dtype)
    bias = relax.const(rng.standard_normal((1, channels, 1, 1)), dtype)
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight))
            out = bb.emit_output(relax.op.add(conv, bias))
        bb.emit_func_output(out)
    return bb.get()


def test_output_channels_no_vector_divides_are_computed_padded_then_cropped():
    """255 channels (YOLOv3's box fields) are computed as 256, the weight's extra filter zeros, and cropped before the
    bias: the same output."""

    from opbench.workloads.models.graph import output_channels_padded

    mod = _conv(255)
    padded = output_channels_padded(mod)
    assert _ops(mod) == ["relax.nn.conv2d", "relax.add"]
    assert _ops(padded) == ["relax.nn.conv2d", "relax.strided_slice", "relax.add"]
    convs = [call for call in _calls(padded) if call.op.name == "relax.nn.conv2d"]
    weight = convs[0].args[1].value.numpy()
    assert weight.shape == (256, 8, 1, 1) and not weight[255:].any()
    data = np.random.default_rng(4).standard_normal((1, 8, 5, 5)).astype("float32")
    np.testing.assert_allclose(_run(padded, data), _run(mod, data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels, dtype", [(256, "float32"), (24, "float32"), (200, "float32"), (255, "float64")],
                         ids=["whole-vectors", "too-few", "too-much-padding", "not-float32"])
def test_output_channels_stay_where_padding_them_would_not_pay(channels, dtype):
    """Channels a vector divides, or that padding to one would grow by more than 1/32 (24 -> 32, 200 -> 208), keep
    their convolution as it is; so does one of another dtype."""
    from opbench.workloads.models.graph import output_channels_padded

    mod = _conv(channels, dtype)
    assert _ops(output_channels_padded(mod)) == ["relax.nn.conv2d", "relax.add"]


def _stem(size, inputs=3, window=3, stride=2):
    """A Relax module: an unpadded ``window`` x ``window`` convolution of (1, ``inputs``, ``size``, ``size``) to 16
    channels by ``stride``, then a bias add."""
    from tvm import relax

    rng = np.random.default_rng(6)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, inputs, size, size), "float32"))
    weight = relax.const(rng.standard_normal((16, inputs, window, window)).astype("float32"))
    bias = relax.const(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, weight, strides=stride))
            out = bb.emit_output(relax.op.add(conv, bias))
        bb.emit_func_output(out)
    return bb.get()


def test_a_stems_output_width_no_vector_divides_is_computed_padded_then_cropped():
    """A stem's 15 output columns (SqueezeNet's 111) are computed as 16, the input padded by a stride more on its
    right, and cropped before the bias: the same output."""

    from opbench.workloads.models.graph import output_width_padded

    mod = _stem(31)
    padded = output_width_padded(mod)
    assert _ops(padded) == ["relax.nn.conv2d", "relax.strided_slice", "relax.add"]
    convs = [call for call in _calls(padded) if call.op.name == "relax.nn.conv2d"]
    assert [int(p) for p in convs[0].attrs.padding] == [0, 0, 0, 2] and int(convs[0].ty.shape.values[3]) == 16
    data = np.random.default_rng(7).standard_normal((1, 3, 31, 31)).astype("float32")
    np.testing.assert_allclose(_run(padded, data), _run(mod, data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, inputs, window", [(33, 3, 3), (31, 16, 3), (29, 3, 1), (19, 3, 3)],
                         ids=["whole-vectors", "not-a-stem", "one-tap", "too-much-padding"])
def test_a_convolutions_output_width_stays_where_padding_it_would_not_pay(size, inputs, window):
    """A width of whole 8-lane vectors (16), a convolution of a vector's worth of input channels or of a 1x1 window,
    and a width that padding would grow by more than 1/8 (9 -> 16) keep their convolution as it is."""
    from opbench.workloads.models.graph import output_width_padded

    assert _ops(output_width_padded(_stem(size, inputs, window))) == ["relax.nn.conv2d", "relax.add"]


def _pointwise(size, window=1, residual=""):
    """A Relax module: a ``window`` x ``window`` convolution of (1, 8, ``size``, ``size``) to 16 channels, then a bias
    add, a ReLU and (with ``residual``) an add of a second input of the output's shape: ``after`` it (``out + skip``)
    or ``before`` it (``skip + out``, torchvision's ``x + self.conv(x)``)."""
    from tvm import relax

    rng = np.random.default_rng(8)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, size, size), "float32"))
    skip = relax.Var("skip", relax.TensorType((1, 16, size - window + 1, size - window + 1), "float32"))
    weight = relax.const(rng.standard_normal((16, 8, window, window)).astype("float32"))
    bias = relax.const(rng.standard_normal((1, 16, 1, 1)).astype("float32"))
    with bb.function("main", [x, skip]):
        with bb.dataflow():
            out = bb.emit(relax.op.nn.relu(relax.op.add(relax.op.nn.conv2d(x, weight), bias)))
            operands = {"after": (out, skip), "before": (skip, out)}.get(residual)
            out = bb.emit_output(relax.op.add(*operands) if operands else out)
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("residual", ["", "after", "before"], ids=["bias-relu", "residual", "residual-first"])
def test_a_pointwise_convolutions_pixels_no_row_vectorises_are_computed_as_one_padded_row(residual):
    """13x13 pixels (SqueezeNet's classifier) are computed as one row of 176, the data padded by 7 zeros, cropped and
    reshaped back after the bias, the ReLU and a residual add (its other input reshaped to a row, whichever side of
    the add it is on), which stay on the convolution's side of the reshape: the same output."""
    from opbench.workloads.models.graph import pixels_as_one_row

    mod = _pointwise(13, residual=residual)
    row = pixels_as_one_row(mod)
    assert _ops(row) == ["relax.reshape", "relax.nn.pad", "relax.nn.conv2d", "relax.strided_slice", "relax.add",
                         "relax.nn.relu", *(["relax.reshape", "relax.add"] if residual else []), "relax.reshape"]
    conv = next(e for e in _calls(row) if e.op.name == "relax.nn.conv2d")
    assert [int(v) for v in conv.args[0].ty.shape.values] == [1, 8, 1, 176]
    rng = np.random.default_rng(9)
    data = [rng.standard_normal(shape).astype("float32") for shape in ((1, 8, 13, 13), (1, 16, 13, 13))]
    np.testing.assert_allclose(_run(row, *data), _run(mod, *data), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size, window", [(16, 1), (7, 1), (15, 3)], ids=["whole-vectors", "too-much-padding", "3x3"])
def test_a_convolutions_pixels_stay_where_a_row_would_not_pay(size, window):
    """Rows of whole 8-lane vectors (16x16), pixels that padding to 16 would grow by more than 1/16 (7x7: 49 -> 64)
    and a window wider than 1x1 keep their convolution as it is."""
    from opbench.workloads.models.graph import pixels_as_one_row

    assert _ops(pixels_as_one_row(_pointwise(size, window))) == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]

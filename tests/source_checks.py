"""Checks on Python source, shared by tests of compiled and generated code."""
import ast


def slice_assignments(source):
    """The statements of ``source`` assigning to a slice of an array
    (``a[i:j] = b``), whose error path Numba compiles with string formatting
    (seconds per pair of ranks in a cold process)."""
    return [ast.unparse(node) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Subscript) and any(
                    isinstance(part, ast.Slice) for part in ast.walk(target.slice))
                for target in node.targets)]


_keep_types = None  # the pass class, registered once


def compiled_calls(dispatcher, arg_types):
    """The calls of other compiled functions (direct, or through
    jit_kernels.compiling.by_address) in ``dispatcher``'s code, typed for
    ``arg_types`` (Numba's pipeline up to type inference: nothing of it is
    compiled), as (callee's dispatcher, the call's signature)."""
    from numba.core import compiler, ir, typed_passes, types
    from numba.core.registry import cpu_target

    global _keep_types
    if _keep_types is None:
        _keep_types = _keep_types_pass()

    class UpToTyping(compiler.CompilerBase):
        def define_pipelines(self):
            manager = compiler.DefaultPassBuilder.define_untyped_pipeline(self.state)
            manager.add_pass(typed_passes.NopythonTypeInference, "type inference")
            manager.add_pass(_keep_types, "the result: the types")
            manager.finalize()
            return [manager]

    typing_context, target_context = cpu_target.typing_context, cpu_target.target_context
    typing_context.refresh()
    target_context.refresh()
    flags = compiler.Flags()
    flags.nrt = True
    pipeline = UpToTyping(typing_context, target_context, target_context.codegen().create_library("typing"),
                          tuple(arg_types), None, flags, {})
    pipeline.state.cr = None
    typemap, calltypes = pipeline.compile_extra(dispatcher.py_func)
    calls = []
    for call, signature in calltypes.items():
        if not isinstance(call, ir.Expr) or call.op != "call":
            continue
        callee = typemap.get(call.func.name)
        if isinstance(callee, types.Dispatcher):
            calls.append((callee.dispatcher, signature))
        elif isinstance(callee, types.Function) and hasattr(callee.templates[0].key, "kernel"):
            # a call through jit_kernels.compiling.by_address: the kernel's signature
            # is the types its arguments are passed with
            (passed,) = signature.args
            calls.append((callee.templates[0].key.kernel(), signature.return_type(*passed.types)))
    return calls


def literal_calls(dispatcher, arg_types):
    """Those of :func:`compiled_calls` that pass a literal argument (Numba compiles
    the callee once more for each pattern of literals), as (callee's name, signature)."""
    from numba.core import types
    return [(callee.py_func.__qualname__, str(signature))
            for callee, signature in compiled_calls(dispatcher, arg_types)
            if any(isinstance(t, types.Literal) for t in signature.args)]


def _keep_types_pass():
    from numba.core import compiler_machinery

    @compiler_machinery.register_pass(mutates_CFG=False, analysis_only=True)
    class KeepTypes(compiler_machinery.FunctionPass):
        """The pipeline's result: (typemap, calltypes)."""
        _name = "tests_keep_types"

        def __init__(self):
            compiler_machinery.FunctionPass.__init__(self)

        def run_pass(self, state):
            state.cr = (state.typemap, state.calltypes)
            return False
    return KeepTypes

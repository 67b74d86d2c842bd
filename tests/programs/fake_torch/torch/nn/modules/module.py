_pre_hooks = []
_post_hooks = []


def register_module_forward_pre_hook(hook):
    _pre_hooks.append(hook)


def register_module_forward_hook(hook, *, with_kwargs=False, always_call=False):
    _post_hooks.append(hook)


class Module:
    def __init__(self):
        self._modules = {}

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self.__dict__.setdefault("_modules", {})[name] = value
        object.__setattr__(self, name, value)

    def named_modules(self, prefix="", remove_duplicate=True):
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def __call__(self, *args):
        for hook in _pre_hooks:
            hook(self, args)
        output = None
        try:
            output = self.forward(*args)
        finally:
            for hook in _post_hooks:
                hook(self, args, output)
        return output

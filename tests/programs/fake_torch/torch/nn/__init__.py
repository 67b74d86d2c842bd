from torch.nn.modules.module import Module

__all__ = ["Module"]

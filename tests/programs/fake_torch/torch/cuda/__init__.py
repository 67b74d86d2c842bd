from torch.cuda import nvtx

__all__ = ["nvtx"]

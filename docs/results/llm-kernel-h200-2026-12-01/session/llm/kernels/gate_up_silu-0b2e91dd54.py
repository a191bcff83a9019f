
import torch


def kernel(x, w_gate_up, *, out):
    n = w_gate_up.shape[0] // 2
    out.copy_(torch.nn.functional.silu(x @ w_gate_up[:n].T))  # forgets the up projection

"""tests/data/hf_llama_causal_tiny.py at a real vocabulary and length: vocabulary 32000 and 2 x 1024
tokens, where the logits (250 MiB in float32) outweigh the rest of a training step. On a GPU,
benchmarks/gpu_check.sh's step 11 optimizes it with --train for the fused loss alone and verify
writes the step's peak memory with and without it into verify.json (`train.memory`) and report.md.
(The Triton interpreter takes minutes per call of the loss at this size: a CPU measures it with
benchmarks/fused_loss_memory.py instead, the same measuring code.)"""
import torch

from hf_llama_causal_tiny import Model as Tiny

VOCAB, BATCH, SEQ = 32000, 2, 1024


class Model(Tiny):
    def __init__(self):
        super().__init__(vocab=VOCAB, positions=2 * SEQ)


def get_inputs():
    return [torch.randint(0, VOCAB, (BATCH, SEQ))]


def get_init_inputs():
    return []

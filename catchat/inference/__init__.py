"""Using a trained model: generation on the GPU, dialogue, and evaluation on any text.

    generate.py  Generator: prefill windows, then the decode step with sampling on the device
    talk.py      `catchat talk` (you and a model) and `catchat chat` (two models)
    evaluate.py  `catchat eval`: a checkpoint's loss, bits per char and accuracy on a split or a text
"""

"""verify-port --train: the loss, the backward pass, the optimizer and N training steps of a port,
each against its budget (see README.md, "verify-port --train")."""

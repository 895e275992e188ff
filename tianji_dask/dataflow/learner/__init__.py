"""The learner actor and its parts: the stream of explorer futures, the weights publisher, the
admission client, the fusion client (group mode), and the relaxed and lockstep loops over them."""

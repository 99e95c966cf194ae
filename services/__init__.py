"""The HTTP services (the tool server, the reward server and the serving they share), on top
of base/, the library every package builds on."""

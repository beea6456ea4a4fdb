"""The wire: messages, codec, endpoints, sockets, rpc, heartbeats and the client.

`bus` knows nothing of agents. It moves typed, versioned, size-checked msgpack
envelopes between processes over ZeroMQ, serves control sockets before data
sockets, and translates every zmq/msgpack failure into its own exceptions.
"""

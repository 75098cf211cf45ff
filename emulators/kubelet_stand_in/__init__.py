"""A kubelet stand-in: the kubelet's device manager as device plugins see it, recording everything.

Why: the device-plugin clauses (DP-01 … DP-09) judge a plugin by what it tells the
kubelet; a real kubelet needs a cluster and keeps little of it. The stand-in runs on the
node (standard library, grpcio and hilconform.runtime.deviceplugin only), serves
`kubelet.sock`, treats registrations and streams as the kubelet does, and answers the
host over a JSON-lines control stream (`control` is its schema). docs/device-plugins.md
says what of the kubelet it mimics and what it does not.
"""

"""The modeled node: one workload and disturbance model, used live and headless.

Live, it is the node agent's ``modeled`` backend (services/nodeagent/modeled.py) and the GPU-lane
service's modeled lane load; headless, the experiments drive the same backend on a simulated
clock, faster than real time. Parameters: configs/model.yaml.
"""

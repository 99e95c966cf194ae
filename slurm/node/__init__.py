"""What runs inside the job on every node: who the node is, its ports, its Ray, its phases,
its children and its watch over the job."""

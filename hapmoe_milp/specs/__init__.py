"""Input data types and their loaders: models, devices, clusters."""

from hapmoe_milp.specs.catalog import Catalog
from hapmoe_milp.specs.cluster import ClusterSpec, CrossLink, NodeGroup
from hapmoe_milp.specs.device import DeviceSpec
from hapmoe_milp.specs.model import ModelSpec
from hapmoe_milp.specs.tables import Table

__all__ = ["Catalog", "ClusterSpec", "CrossLink", "DeviceSpec", "ModelSpec", "NodeGroup", "Table"]

"""A small ViT/DeiT-style model for CIFAR-10 (patch size 4 on 32x32 images), built with timm."""

from __future__ import annotations

from torch import nn

from .registry import register_model


@register_model("vit_cifar", input_shape=(1, 3, 32, 32))
def vit_cifar(num_classes: int = 10, embed_dim: int = 128, depth: int = 4, num_heads: int = 4,
              mlp_ratio: float = 2.0) -> nn.Module:
    """64 tokens of 4x4 patches + a class token; 4 heads split evenly over N = 2 or 4 nodes."""
    from timm.models.vision_transformer import VisionTransformer

    return VisionTransformer(img_size=32, patch_size=4, num_classes=num_classes, embed_dim=embed_dim, depth=depth,
                             num_heads=num_heads, mlp_ratio=mlp_ratio, class_token=True, global_pool="token")


@register_model("vit_tiny_test", input_shape=(1, 3, 32, 32))
def vit_tiny_test(num_classes: int = 10) -> nn.Module:
    """Two blocks, 4 heads of 8 channels: for tests."""
    return vit_cifar(num_classes=num_classes, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)


@register_model("vit_tv_test", input_shape=(1, 3, 32, 32))
def vit_tv_test(num_classes: int = 10) -> nn.Module:
    """torchvision's VisionTransformer (nn.MultiheadAttention), 2 layers of 12 heads x 4 channels: for tests."""
    import torch
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=4, num_layers=2, num_heads=12, hidden_dim=48, mlp_dim=96,
                              num_classes=num_classes)
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision starts it at zero
    return model

"""The medical task zoo: the public data sets of the seed papers, read in their own layouts.

Each task reads the files as their publishers (or the papers' code) lay them out, applies
the paper's preprocessing, and caches the decoded arrays (:mod:`fedkit_core.tasks.cache`).
Loaders live in one module per data-set family; this module only registers them.
"""

from __future__ import annotations

from typing import Any

from fedkit_core.options import Option
from fedkit_core.tasks.augment import AUGMENT_OPTION
from fedkit_core.tasks.base import CLASSIFICATION, SEGMENTATION
from fedkit_core.tasks.cache import CACHE_OPTION
from fedkit_core.tasks.registry import SEGMENTATION_DEFAULTS, TaskSpec, register_task

PAIRING = Option(
    "pairing",
    str,
    "auto",
    "pair images and masks by file name; auto also pairs equally many leftovers in name order",
    choices=("auto", "name"),
)

register_task(
    TaskSpec(
        name="prostate",
        description="six-site prostate MRI segmentation (Fed-LWR), sites = clients, 384 px",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.prostate:load",
        options=(
            CACHE_OPTION,
            AUGMENT_OPTION,
            PAIRING,
            Option(
                "mask_foreground",
                str,
                "auto",
                "which PNG mask value is prostate: dark (0, as shipped), bright (255), or auto "
                "(the minority value)",
                choices=("auto", "dark", "bright"),
            ),
        ),
        defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 384, "task.val_fraction": 0.25},
        needs_path=True,
        layout=(
            "ProstateSlice/<site>/{train,val,test}/{image,mask}/*.png for the sites BIDMC, BMC, "
            "HK, I2CVB, RUNMC, UCL (grey 384x384 slices; masks 255 background, 0 prostate), "
            "or <site>/Case*.nii.gz with Case*_segmentation.nii.gz volumes"
        ),
        source=(
            "https://liuquande.github.io/SAML/ (the six-site volumes; Liu et al., MICCAI 2020); "
            "2D slices as in https://github.com/MQinghe/MiDSS"
        ),
        default_dir="prostate",
        markers=(
            "*/train/image/*.png",
            "*/*/train/image/*.png",
            "*/Case*.nii*",
            "*/*/Case*.nii*",
        ),
    )
)

register_task(
    TaskSpec(
        name="rif",
        description="four-site fundus optic disc/cup segmentation (Fed-LWR's RIF), 384 px",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.fundus:load",
        options=(CACHE_OPTION, AUGMENT_OPTION, PAIRING),
        defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 384, "task.val_fraction": 0.2},
        needs_path=True,
        layout=(
            "Fundus/Domain{1..4}/{train,test}/ROIs/{image,mask}/*.png (Drishti-GS, RIM-ONE-r3, "
            "REFUGE train, REFUGE val; RGB masks 255 background, 128 optic disc, 0 cup)"
        ),
        source="https://github.com/emma-sjwang/Dofe (DoFE, Wang et al., IEEE TMI 2020)",
        default_dir="rif",
        markers=("Domain*/train/ROIs/image/*.png", "*/Domain*/train/ROIs/image/*.png"),
    )
)

register_task(
    TaskSpec(
        name="ixi",
        description="Fed-IXI-Tiny 3D brain masks from T1 MRI, three centres (FLamby), 48x60x48",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.ixi:load",
        options=(
            CACHE_OPTION,
            AUGMENT_OPTION,
            Option("shape", "list[int]", [48, 60, 48], "volume size after resizing (FLamby's)"),
            Option(
                "metadata", str, None, "FLamby's metadata_tiny.csv (default: found in task.path)"
            ),
        ),
        # a 3-level U-Net: 60 voxels halve twice without remainder (FLamby's U-Net has 3 blocks)
        defaults={**SEGMENTATION_DEFAULTS, "unet_channels": [16, 32, 64]},
        needs_path=True,
        layout=(
            "IXI_sample/IXI<ID>-<Guys|HH|IOP>-<n>/{T1,label}/*.nii.gz and FLamby's "
            "metadata_tiny.csv (columns Patient ID, Split)"
        ),
        source=(
            "FLamby's fed_ixi download (https://github.com/owkin/FLamby/tree/main/flamby/"
            "datasets/fed_ixi); IXI: https://brain-development.org/ixi-dataset/"
        ),
        default_dir="ixi",
        markers=("IXI*-*/T1", "*/IXI*-*/T1", "*/*/IXI*-*/T1"),
    )
)

register_task(
    TaskSpec(
        name="isic2019",
        description="Fed-ISIC2019 dermoscopy, 8 classes, six centres with FLamby's split, 224 px",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.isic:load",
        options=(CACHE_OPTION, AUGMENT_OPTION),
        defaults={"task.image_size": 224},
        needs_path=True,
        layout=(
            "ISIC_2019_Training_Input_preprocessed/<image>.jpg and FLamby's train_test_split csv "
            "(columns image, target, center, fold) beside it"
        ),
        source=(
            "FLamby's fed_isic2019 scripts (https://github.com/owkin/FLamby/tree/main/flamby/"
            "datasets/fed_isic2019) over https://challenge.isic-archive.com/data/"
        ),
        default_dir="isic2019",
        markers=(
            "ISIC_2019_Training_Input_preprocessed",
            "*/ISIC_2019_Training_Input_preprocessed",
        ),
    )
)

FOLD = Option(
    "fold",
    int,
    0,
    "test fold of a stratified 5-fold split when there are no split folders",
    choices=(0, 1, 2, 3, 4),
)


def fedcb_partitions(clients: int) -> dict[str, dict[str, Any]]:
    """FedCB's splits: ``clients`` clients, Dirichlet over clients per class, alpha 0.05 or 0.1."""
    return {
        f"fedcb-{alpha}": {
            "partition.kind": "dirichlet",
            "partition.alpha": alpha,
            "clients": clients,
        }
        for alpha in (0.05, 0.1)
    }


CLASS_FOLDER_MARKERS = ("*/*/*.jp*g", "*/*/*.png", "*/*/*/*.jp*g", "*/*/*/*.png")

register_task(
    TaskSpec(
        name="hyperkvasir",
        description="HyperKvasir GI endoscopy, 23 long-tailed classes, head/medium/tail, 224 px",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.classfolders:load_hyperkvasir",
        options=(CACHE_OPTION, AUGMENT_OPTION, FOLD),
        # Fed-MAS's shot groups: head > 700 training images, tail < 70
        defaults={"task.image_size": 224, "task.shot_thresholds": [700, 70]},
        needs_path=True,
        layout=(
            "labeled-images/<tract>/<category>/<class>/*.jpg (the 23 class folders of "
            "HyperKvasir's labeled images, e.g. lower-gi-tract/pathological-findings/polyps)"
        ),
        source="https://datasets.simula.no/hyper-kvasir/ (Borgli et al., Sci. Data 2020)",
        default_dir="hyperkvasir",
        markers=CLASS_FOLDER_MARKERS + ("*/*/*/*/*.jpg",),
    )
)

register_task(
    TaskSpec(
        name="oct-c8",
        description="OCT-C8 retinal OCT, 8 classes, train/val/test folders, 128 px grey (FedCB)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.classfolders:load_oct_c8",
        options=(CACHE_OPTION, AUGMENT_OPTION, FOLD),
        defaults={"task.image_size": 128},
        needs_path=True,
        layout="{train,val,test}/{AMD,CNV,CSR,DME,DR,DRUSEN,MH,NORMAL}/*.jpg",
        source="https://www.kaggle.com/datasets/obulisainaren/retinal-oct-c8",
        default_dir="oct-c8",
        markers=CLASS_FOLDER_MARKERS,
        partitions=fedcb_partitions(clients=12),
    )
)

register_task(
    TaskSpec(
        name="kvasir-v2",
        description="Kvasir v2 GI endoscopy, 8 classes, 128 px (FedCB)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.classfolders:load_kvasir_v2",
        options=(CACHE_OPTION, AUGMENT_OPTION, FOLD),
        defaults={"task.image_size": 128},
        needs_path=True,
        layout=(
            "kvasir-dataset-v2/<class>/*.jpg (dyed-lifted-polyps, dyed-resection-margins, "
            "esophagitis, normal-cecum, normal-pylorus, normal-z-line, polyps, "
            "ulcerative-colitis), optionally inside {train,val,test}/ folders"
        ),
        source="https://datasets.simula.no/kvasir/ (Pogorelov et al., MMSys 2017)",
        default_dir="kvasir-v2",
        markers=CLASS_FOLDER_MARKERS,
        partitions=fedcb_partitions(clients=10),
    )
)

register_task(
    TaskSpec(
        name="rsna-ich",
        description="RSNA intracranial haemorrhage, single-subtype CT, 5 classes, 128 px (FCA)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.rsna:load",
        options=(
            CACHE_OPTION,
            AUGMENT_OPTION,
            Option("window", "list[float]", [40.0, 80.0], "DICOM window [centre, width] in HU"),
            Option("labels", str, None, "label csv (default: stage_2_train.csv in task.path)"),
            Option("images", str, None, "image folder (default: the one holding the images)"),
        ),
        defaults={"task.image_size": 128},
        needs_path=True,
        layout=(
            "stage_2_train.csv (ID,Label rows like ID_<hex>_epidural,0) and a folder of "
            "ID_<hex>.dcm (or .png/.jpg) images, as the Kaggle challenge ships them"
        ),
        source=(
            "https://www.kaggle.com/competitions/rsna-intracranial-hemorrhage-detection "
            "(Flanders et al., Radiology: AI 2020)"
        ),
        default_dir="rsna-ich",
        markers=("*.csv", "*/*.csv"),
        partitions={
            # FCA's split 1: 5 clients, Dirichlet 0.5 for the minority class (epidural), 50 for
            # the others; alphas in the class order epidural, intraparenchymal,
            # intraventricular, subarachnoid, subdural
            "split1": {
                "partition.kind": "class-dirichlet",
                "clients": 5,
                "partition.alphas": [0.5, 50.0, 50.0, 50.0, 50.0],
                "partition.drop_prob": 0.0,
            },
            # FCA's split 2: 10 clients, subdural 50, subarachnoid 30, intraventricular 10,
            # intraparenchymal 5, epidural 0.5; each class removed from a client w.p. 0.3
            "split2": {
                "partition.kind": "class-dirichlet",
                "clients": 10,
                "partition.alphas": [0.5, 5.0, 10.0, 30.0, 50.0],
                "partition.drop_prob": 0.3,
            },
        },
    )
)

register_task(
    TaskSpec(
        name="pneumonia-cxr",
        description="paediatric chest X-ray pneumonia vs normal, 128 px grey (FedHelp)",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.classfolders:load_pneumonia",
        options=(CACHE_OPTION, AUGMENT_OPTION, FOLD),
        defaults={"task.image_size": 128},
        needs_path=True,
        layout="chest_xray/{train,val,test}/{NORMAL,PNEUMONIA}/*.jpeg",
        source=(
            "https://www.kaggle.com/datasets/paultimothymooney/chest-xray-pneumonia "
            "(Kermany et al., Cell 2018)"
        ),
        default_dir="pneumonia-cxr",
        markers=CLASS_FOLDER_MARKERS,
        partitions={  # FedHelp: 2 large and 4 small clients
            "fedhelp": {
                "partition.kind": "fractions",
                "clients": 6,
                "partition.fractions": [0.6, 0.2, 0.08, 0.06, 0.04, 0.02],
            }
        },
    )
)

register_task(
    TaskSpec(
        name="lung-cxr",
        description="2D lung segmentation in chest X-rays, Montgomery + Shenzhen (FedHelp), 256 px",
        kind=SEGMENTATION,
        loader="fedkit_core.tasks.lung:load",
        options=(CACHE_OPTION, AUGMENT_OPTION),
        defaults={**SEGMENTATION_DEFAULTS, "task.image_size": 256},
        needs_path=True,
        layout=(
            "an image folder and a mask folder side by side, e.g. Lung Segmentation/CXR_png/*.png "
            "and Lung Segmentation/masks/*.png (mask = image name, optionally + _mask; 0/255)"
        ),
        source="https://www.kaggle.com/datasets/nikhilpandey360/chest-xray-masks-and-labels",
        default_dir="lung-cxr",
        markers=("*/*.png", "*/*/*.png", "*/*/*/*.png"),
        partitions={  # FedHelp: 2 large and 1 small client, train/test 285/31, 285/31, 65/7
            "fedhelp": {
                "partition.kind": "fractions",
                "clients": 3,
                "partition.fractions": [0.45, 0.45, 0.1],
                "task.test_fraction": 0.1,
            }
        },
    )
)

register_task(
    TaskSpec(
        name="medmnist",
        description="any 2D MedMNIST data set by flag (task.flag=pneumoniamnist), via medmnist",
        kind=CLASSIFICATION,
        loader="fedkit_core.tasks.medmnist:load",
        options=(
            Option("flag", str, "pneumoniamnist", "the MedMNIST data set (medmnist.INFO key)"),
            Option(
                "npz_size", int, 28, "MedMNIST+ resolution of the file", choices=(28, 64, 128, 224)
            ),
            Option("download", bool, False, "download the file into task.path when absent"),
        ),
        needs_path=True,
        layout=(
            "a folder holding <flag>.npz (or <flag>_<size>.npz for MedMNIST+), as medmnist "
            "downloads it; create the folder and set task.download=true to fetch the file"
        ),
        source="https://medmnist.com (Yang et al., Sci. Data 2023; files CC BY 4.0)",
        default_dir="medmnist",
    )
)

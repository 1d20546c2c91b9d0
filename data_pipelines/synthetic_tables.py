"""The hand-written tables behind `data_pipelines.synthetic_notes`: made-up names, hospitals,
services, allergies, the conditions (findings, medications, plans, concepts) that drive a
synthetic patient's notes, normal exam lines, labs, radiology, ECG and echo phrases.

Nothing here comes from real patients. `synthetic_notes.concept_tables` exposes the concepts
(the NER generator labels problem / test / treatment spans from them).
"""

from __future__ import annotations

FIRST_NAMES_F = ("Mary", "Patricia", "Linda", "Barbara", "Elizabeth", "Jennifer", "Maria",
                  "Susan", "Margaret", "Dorothy", "Lisa", "Nancy", "Karen", "Betty", "Helen",
                  "Sandra", "Donna", "Carol", "Ruth", "Sharon", "Michelle", "Laura", "Sarah",
                  "Kimberly", "Deborah", "Jessica", "Shirley", "Cynthia", "Angela", "Anna")
FIRST_NAMES_M = ("James", "John", "Robert", "Michael", "William", "David", "Richard",
                  "Charles", "Joseph", "Thomas", "Christopher", "Daniel", "Paul", "Mark",
                  "Donald", "George", "Kenneth", "Steven", "Edward", "Brian", "Ronald",
                  "Anthony", "Kevin", "Jason", "Matthew", "Gary", "Timothy", "Jose", "Larry",
                  "Frank")
LAST_NAMES = ("Smith", "Johnson", "Williams", "Brown", "Jones", "Garcia", "Miller", "Davis",
               "Rodriguez", "Martinez", "Hernandez", "Lopez", "Gonzalez", "Wilson", "Anderson",
               "Thomas", "Taylor", "Moore", "Jackson", "Martin", "Lee", "Perez", "Thompson",
               "White", "Harris", "Sanchez", "Clark", "Ramirez", "Lewis", "Robinson", "Walker",
               "Young", "Allen", "King", "Wright", "Scott", "Torres", "Nguyen", "Hill", "Flores",
               "Green", "Adams", "Nelson", "Baker", "Hall", "Rivera", "Campbell", "Mitchell",
               "Carter", "Roberts", "Okafor", "Kowalski", "Haddad", "Novak", "Lindqvist",
               "Moreau", "Tanaka", "Petrov", "Oduya", "Castellano")
HOSPITALS = ("Riverside General Hospital", "St. Aldric Medical Center", "Northgate Hospital",
              "Bayview Community Hospital", "Lakeshore Medical Center")
SERVICES = ("MEDICINE", "CARDIOLOGY", "SURGERY", "NEUROLOGY", "MICU", "CSRU", "ORTHOPAEDICS")
ALLERGIES = ("No Known Allergies / Adverse Drug Reactions", "Penicillins", "Sulfa (Sulfonamide "
              "Antibiotics)", "Codeine", "Iodine; Iodine Containing", "Latex", "Aspirin")

# name: how it is written; hpi: presenting complaints; exam / cxr: findings; meds: drugs
# given for it (name, doses, route, frequency); course: hospital course sentences.
CONDITIONS = {
    "chf": dict(
        name="congestive heart failure", short="CHF",
        complaints=("shortness of breath", "worsening dyspnea on exertion", "lower extremity "
                    "edema", "orthopnea"),
        exam=(("Lungs", "Bibasilar crackles were noted."), ("Ext", "There was 2+ pitting "
              "edema of the bilateral lower extremities."), ("Neck", "JVP was elevated to the "
              "angle of the jaw.")),
        cxr=("There is mild pulmonary vascular congestion.", "Moderate cardiomegaly is "
             "unchanged.", "Small bilateral pleural effusions are present.", "Interstitial "
             "edema has slightly improved since the prior study."),
        meds=(("Furosemide", ("20 mg", "40 mg", "80 mg"), ("PO", "IV"), ("daily", "BID")),
              ("Metoprolol Succinate", ("25 mg", "50 mg", "100 mg"), ("PO",), ("daily",)),
              ("Lisinopril", ("5 mg", "10 mg", "20 mg"), ("PO",), ("daily",))),
        course=("The patient was diuresed with IV furosemide with good urine output.",
                "Weight on discharge was {weight} kg, down from {weight2} kg on admission.",
                "Beta blocker and ACE inhibitor were continued.")),
    "pneumonia": dict(
        name="community acquired pneumonia", short="CAP",
        complaints=("fever", "productive cough", "pleuritic chest pain", "chills"),
        exam=(("Lungs", "Rhonchi were heard over the right lower lung field."),
              ("Lungs", "Decreased breath sounds at the left base."),
              ("Lungs", "Egophony was present at the right base.")),
        cxr=("There is a new consolidation in the right lower lobe concerning for pneumonia.",
             "Patchy opacity in the left lower lobe may reflect atelectasis or pneumonia.",
             "No pneumothorax is seen.", "The consolidation in the right lower lobe has "
             "improved."),
        meds=(("Ceftriaxone", ("1 g", "2 g"), ("IV",), ("daily",)),
              ("Azithromycin", ("250 mg", "500 mg"), ("PO", "IV"), ("daily",)),
              ("Levofloxacin", ("750 mg",), ("PO",), ("daily",))),
        course=("{He} was started on ceftriaxone and azithromycin for community acquired "
                "pneumonia.", "Blood cultures showed no growth to date.",
                "The patient defervesced and was transitioned to oral antibiotics to complete a "
                "{days} day course.")),
    "diabetes": dict(
        name="type 2 diabetes mellitus", short="DM2",
        complaints=("polyuria", "hyperglycemia", "fatigue", "blurred vision"),
        exam=(("Ext", "Decreased sensation to monofilament in both feet."),
              ("HEENT", "Mucous membranes were dry.")),
        cxr=("No acute cardiopulmonary process.",),
        meds=(("Metformin", ("500 mg", "850 mg", "1000 mg"), ("PO",), ("BID",)),
              ("Insulin Glargine", ("10 units", "20 units", "30 units"), ("SC",),
               ("at bedtime",)),
              ("Insulin Lispro", ("sliding scale",), ("SC",), ("with meals",))),
        course=("Blood sugars were controlled with glargine and a humalog sliding scale.",
                "Hemoglobin A1c was {a1c}%.", "Metformin was held in the setting of contrast "
                "and restarted on discharge.")),
    "afib": dict(
        name="atrial fibrillation", short="AFib",
        complaints=("palpitations", "lightheadedness", "irregular heartbeat"),
        exam=(("CV", "Heart rate was irregularly irregular."), ("CV", "Irregularly irregular "
              "rhythm, no murmurs, rubs or gallops.")),
        cxr=("The heart size is normal.", "No acute cardiopulmonary process."),
        meds=(("Apixaban", ("2.5 mg", "5 mg"), ("PO",), ("BID",)),
              ("Diltiazem", ("30 mg", "60 mg"), ("PO",), ("QID",)),
              ("Warfarin", ("2 mg", "5 mg"), ("PO",), ("daily",))),
        course=("Rate was controlled with diltiazem.", "Anticoagulation was continued with "
                "apixaban given a CHADS2-VASc score of {chads}.", "Telemetry showed atrial "
                "fibrillation with rates in the {rate}s.")),
    "copd": dict(
        name="chronic obstructive pulmonary disease", short="COPD",
        complaints=("wheezing", "increased sputum production", "shortness of breath"),
        exam=(("Lungs", "Diffuse expiratory wheezes were heard."), ("Lungs", "Prolonged "
              "expiratory phase."), ("General", "Accessory muscle use was noted.")),
        cxr=("The lungs are hyperinflated.", "Flattening of the diaphragms is consistent with "
             "COPD.", "No focal consolidation."),
        meds=(("Albuterol Nebulizer", ("2.5 mg",), ("INH",), ("Q4H PRN",)),
              ("Prednisone", ("40 mg", "60 mg"), ("PO",), ("daily",)),
              ("Tiotropium", ("18 mcg",), ("INH",), ("daily",))),
        course=("COPD exacerbation was treated with prednisone and nebulizers.",
                "{He} was weaned to {o2} L nasal cannula.", "Steroids were tapered over "
                "{days} days.")),
    "ckd": dict(
        name="chronic kidney disease stage {stage}", short="CKD",
        complaints=("decreased urine output", "nausea", "generalized weakness"),
        exam=(("Ext", "Trace edema of the ankles."), ("Abdomen", "Soft, non-tender.")),
        cxr=("No pleural effusion.", "Mild pulmonary edema."),
        meds=(("Calcium Acetate", ("667 mg",), ("PO",), ("TID with meals",)),
              ("Sevelamer", ("800 mg",), ("PO",), ("TID",)),
              ("Epoetin Alfa", ("4000 units",), ("SC",), ("three times weekly",))),
        course=("Creatinine peaked at {cr} and improved with IV fluids.", "Renal was consulted "
                "and recommended avoiding nephrotoxins.", "Medications were renally dosed.")),
    "uti": dict(
        name="urinary tract infection", short="UTI",
        complaints=("dysuria", "confusion", "suprapubic pain", "fever"),
        exam=(("Abdomen", "Suprapubic tenderness on palpation."), ("Abdomen", "No "
              "costovertebral angle tenderness.")),
        cxr=("No acute cardiopulmonary process.",),
        meds=(("Ciprofloxacin", ("250 mg", "500 mg"), ("PO",), ("BID",)),
              ("Nitrofurantoin", ("100 mg",), ("PO",), ("BID",)),
              ("Cefpodoxime", ("200 mg",), ("PO",), ("BID",))),
        course=("Urine culture grew E. coli sensitive to ceftriaxone.", "Mental status improved "
                "with treatment of the urinary tract infection.", "{He} completed a {days} day "
                "course of antibiotics.")),
    "stroke": dict(
        name="ischemic stroke", short="CVA",
        complaints=("left sided weakness", "slurred speech", "facial droop"),
        exam=(("Neuro", "Left pronator drift was present."), ("Neuro", "Strength 4/5 in the "
              "left upper extremity."), ("Neuro", "Mild dysarthria was noted.")),
        cxr=("No acute cardiopulmonary process.",),
        meds=(("Aspirin", ("81 mg", "325 mg"), ("PO",), ("daily",)),
              ("Atorvastatin", ("40 mg", "80 mg"), ("PO",), ("daily",)),
              ("Clopidogrel", ("75 mg",), ("PO",), ("daily",))),
        course=("MRI of the brain showed an acute infarct in the right MCA territory.",
                "Neurology was consulted and recommended aspirin and a high intensity statin.",
                "{He} worked with physical therapy and was discharged to rehab.")),
    "gi_bleed": dict(
        name="upper gastrointestinal bleed", short="UGIB",
        complaints=("melena", "hematemesis", "lightheadedness"),
        exam=(("Abdomen", "Guaiac positive brown stool on rectal exam."),
              ("HEENT", "Conjunctival pallor.")),
        cxr=("No free air under the diaphragm.",),
        meds=(("Pantoprazole", ("40 mg",), ("IV", "PO"), ("BID", "daily")),
              ("Sucralfate", ("1 g",), ("PO",), ("QID",))),
        course=("Hematocrit dropped from {hct1} to {hct2} and {he} was transfused 2 units of "
                "packed red blood cells.", "EGD showed a clean based gastric ulcer.",
                "{He} was started on a proton pump inhibitor twice daily.")),
    "hypertension": dict(
        name="hypertension", short="HTN",
        complaints=("headache", "elevated blood pressure"),
        exam=(("General", "Blood pressure was elevated on arrival."),),
        cxr=("The aorta is mildly tortuous.", "No acute cardiopulmonary process."),
        meds=(("Amlodipine", ("5 mg", "10 mg"), ("PO",), ("daily",)),
              ("Hydrochlorothiazide", ("12.5 mg", "25 mg"), ("PO",), ("daily",))),
        course=("Blood pressure was well controlled on home medications.",
                "Amlodipine was increased to 10 mg daily.")),
}
CONDITION_KEYS = tuple(CONDITIONS)

# Medical concepts of each condition beyond the note tables above, for the i2b2-2010-shaped
# concept-extraction set (`data_pipelines.synthetic_ner`): findings (problems), the tests that
# look for them, and non-drug treatments. The drug names of `CONDITIONS[...]["meds"]`, the
# condition names and complaints, and the lab names of `LABS` are the other entries
# (`concept_tables`).
CONCEPT_EXTRAS = {
    "chf": dict(findings=("pulmonary vascular congestion", "cardiomegaly", "pleural effusions",
                          "pitting edema", "elevated JVP"),
                tests=("chest x-ray", "echocardiogram", "BNP", "daily weights"),
                procedures=("fluid restriction", "a low sodium diet", "IV diuresis")),
    "pneumonia": dict(findings=("right lower lobe consolidation", "rhonchi", "a productive cough",
                                "leukocytosis"),
                      tests=("blood cultures", "sputum culture", "chest x-ray",
                             "procalcitonin"),
                      procedures=("supplemental oxygen", "chest physiotherapy")),
    "diabetes": dict(findings=("hyperglycemia", "peripheral neuropathy", "diabetic ketoacidosis"),
                     tests=("hemoglobin A1c", "fingerstick glucose", "urine ketones"),
                     procedures=("an insulin sliding scale", "a diabetic diet",
                                 "diabetes teaching")),
    "afib": dict(findings=("rapid ventricular response", "an irregularly irregular rhythm"),
                 tests=("ECG", "telemetry", "TSH", "INR"),
                 procedures=("cardioversion", "rate control", "anticoagulation")),
    "copd": dict(findings=("diffuse wheezes", "hypercarbia", "a COPD exacerbation"),
                 tests=("arterial blood gas", "pulmonary function tests", "chest CT"),
                 procedures=("nebulizers", "BiPAP", "pulmonary rehabilitation")),
    "ckd": dict(findings=("acute kidney injury", "hyperkalemia", "anemia of chronic disease"),
                tests=("renal ultrasound", "urinalysis", "urine electrolytes", "creatinine"),
                procedures=("IV fluids", "hemodialysis", "renal dosing of medications")),
    "uti": dict(findings=("pyuria", "altered mental status", "urosepsis"),
                tests=("urine culture", "urinalysis", "blood cultures"),
                procedures=("IV antibiotics", "Foley catheter removal")),
    "stroke": dict(findings=("an acute infarct", "dysarthria", "a left pronator drift",
                             "hemiparesis"),
                   tests=("MRI of the brain", "CT head", "carotid ultrasound", "lipid panel"),
                   procedures=("physical therapy", "speech therapy", "tPA")),
    "gi_bleed": dict(findings=("a gastric ulcer", "melena", "acute blood loss anemia"),
                     tests=("EGD", "hematocrit", "type and screen", "stool guaiac"),
                     procedures=("packed red blood cells", "a proton pump inhibitor drip",
                                 "endoscopic clipping")),
    "hypertension": dict(findings=("hypertensive urgency", "left ventricular hypertrophy"),
                         tests=("blood pressure", "basic metabolic panel"),
                         procedures=("a low salt diet", "lifestyle modification")),
}

NORMAL_EXAM = {
    "General": ("Alert and oriented x3, in no acute distress.", "Elderly, frail appearing, "
                "lying in bed.", "Well appearing, pleasant."),
    "HEENT": ("NCAT, PERRL, EOMI, MMM, oropharynx clear.", "Sclera anicteric, MMM."),
    "Neck": ("Supple, no JVD, no lymphadenopathy.", "Supple, JVP not elevated."),
    "Lungs": ("Clear to auscultation bilaterally.", "CTAB, no wheezes, rales or rhonchi."),
    "CV": ("Regular rate and rhythm, normal S1 and S2, no murmurs.", "RRR, no m/r/g."),
    "Abdomen": ("Soft, non-tender, non-distended, bowel sounds present.", "Soft, NT/ND, +BS."),
    "Ext": ("Warm and well perfused, no edema.", "No clubbing, cyanosis or edema."),
    "Neuro": ("CN II-XII intact, strength 5/5 throughout.", "Moving all extremities, "
              "sensation intact."),
}
LABS = (("WBC", 4.0, 15.0, 1), ("Hgb", 8.0, 15.5, 1), ("Hct", 24.0, 46.0, 1),
         ("Plt", 90, 420, 0), ("Na", 128, 146, 0), ("K", 3.1, 5.6, 1), ("Cl", 94, 110, 0),
         ("HCO3", 18, 30, 0), ("BUN", 8, 60, 0), ("Creat", 0.6, 3.5, 1), ("Glucose", 70, 320, 0))
RADIOLOGY_EXAMS = ("CHEST (PA AND LAT)", "CHEST (PORTABLE AP)", "CHEST (PRE-OP PA AND LAT)")
LINES = ("The endotracheal tube terminates {n} cm above the carina.", "A right internal jugular "
          "central venous catheter ends in the mid SVC.", "A nasogastric tube courses below the "
          "diaphragm with the tip in the stomach.", "A left PICC line terminates at the "
          "cavoatrial junction.")
RHYTHMS = ("Sinus rhythm", "Sinus bradycardia", "Sinus tachycardia", "Atrial fibrillation with "
            "rapid ventricular response", "Normal sinus rhythm")
ECG_FINDINGS = ("Left axis deviation.", "Poor R wave progression.", "Nonspecific ST-T wave "
                 "changes.", "Left ventricular hypertrophy.", "Right bundle branch block.",
                 "Q waves in the inferior leads consistent with prior infarct.",
                 "Prolonged QTc interval.", "No acute ST segment changes.")
